"""The benchmark's outputs: a text table, a Markdown table (docs/performance.md), plots."""

from typing import List

from bench import contenders

ORDER = contenders.DEFAULT + contenders.OPTIONAL


def replicas(strategy: str) -> int:
    """Replicas in sync for a ``--strategies`` entry (``parameter_server:N``:
    N workers, each one replica, asynchronous)."""
    kind, _, count = strategy.partition(":")
    return 1 if kind == "one_device" else int(count or 1)


def _ratio(result: dict, key: str) -> str:
    ratio = result.get(key)
    if not ratio:
        return "-"
    return (f"{ratio['median']:.2f} [{ratio['p25']:.2f}-{ratio['p75']:.2f}] "
            f"({ratio['first_half_median']:.2f}/{ratio['second_half_median']:.2f})")


def _rows(runs: List[dict]):
    for run in runs:
        config = run["config"]
        for name in ORDER:
            if name in run.get("results", {}):
                yield config, name, run["results"][name]
        if "error" in run:
            yield config, "(all)", {"error": run["error"]}


def text_table(runs: List[dict]) -> str:
    """One row per configuration and contender; ratios are paired medians
    [quartiles] (first half / second half of the rounds)."""
    header = (f"{'strategy':<18} {'model':<9} {'spe':>3}  {'contender':<13} "
              f"{'ex/s median':>11} {'[p25-p75]':>17}  {'vs loop':<28} {'vs keras':<28} "
              f"{'1st run s':>9} {'RSS+ MB':>7}")
    lines = [header, "-" * len(header)]
    for config, name, result in _rows(runs):
        prefix = (f"{config['strategy']:<18} {config['model']:<9} "
                  f"{config['steps_per_execution']:>3}  {name:<13} ")
        if "error" in result:
            lines.append(prefix + "failed: " + result["error"][:100])
            continue
        rate = result["examples_per_s"]
        lines.append(
            f"{prefix}{rate['median']:11,.0f} {'[' + format(rate['p25'], ',.0f') + '-' + format(rate['p75'], ',.0f') + ']':>17}  "
            f"{_ratio(result, 'vs_loop'):<28} {_ratio(result, 'vs_keras'):<28} "
            f"{result['first_run_s']:9.1f} {result['rss_growth_mb']:7.0f}")
    return "\n".join(lines)


def markdown_table(runs: List[dict]) -> str:
    """The Performance page's table: ex/s and paired ratios per configuration."""
    lines = ["| strategy | model | spe | contender | ex/s (median) | vs hand-written loop, "
             "median [p25-p75] (1st/2nd half) | vs Keras fit |",
             "|---|---|---|---|---|---|---|"]
    for config, name, result in _rows(runs):
        cells = [config["strategy"], config["model"], str(config["steps_per_execution"]), name]
        if "error" in result:
            cells += ["fails: " + result["error"][:80].replace("|", "/"), "", ""]
        else:
            cells += [f"{result['examples_per_s']['median']:,.0f}",
                      _ratio(result, "vs_loop"), _ratio(result, "vs_keras")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_table(runs: List[dict]) -> str:
    """Markdown, one row per configuration: the hand-written loop's ex/s and
    every contender's paired ratio to it, and tfdist's to Keras ``fit``
    ("fails": the contender raised; "n/a": not run under this strategy)."""
    lines = ["| strategy | model | spe | loop ex/s | tfdist vs loop | attach vs loop | "
             "Keras fit vs loop | tfdist vs Keras |", "|---|---|---|---|---|---|---|---|"]
    for run in runs:
        config, results = run["config"], run.get("results", {})
        loop = results.get(contenders.REFERENCE, {}).get("examples_per_s")

        def cell(name, key="vs_loop"):
            if name not in results:
                return "n/a"
            return "fails" if "error" in results[name] else _ratio(results[name], key)

        keras_ran = "keras_fit" in results and "error" not in results["keras_fit"]
        lines.append("| " + " | ".join([
            config["strategy"], config["model"], str(config["steps_per_execution"]),
            f"{loop['median']:,.0f}" if loop else run.get("error", "fails"),
            cell("tfdist"), cell("tfdist_attach"), cell("keras_fit"),
            cell("tfdist", "vs_keras") if keras_ran else "-"]) + " |")
    return "\n".join(lines)


def scaling_points(runs: List[dict]) -> dict:
    """``{(model, spe): {contender: [(replicas, ex/s)]}}`` over the
    synchronous single-process strategies (one device, Mirrored)."""
    points = {}
    for config, name, result in _rows(runs):
        if config["strategy"].partition(":")[0] not in ("one_device", "mirrored"):
            continue
        if "examples_per_s" not in result:
            continue
        key = (config["model"], config["steps_per_execution"])
        points.setdefault(key, {}).setdefault(name, []).append(
            (replicas(config["strategy"]), result["examples_per_s"]["median"]))
    return {key: {name: sorted(values) for name, values in by_name.items()}
            for key, by_name in points.items()}


def scaling_table(runs: List[dict]) -> str:
    """Markdown: ex/s against replicas, with the ideal (1 replica x N)."""
    lines = ["| model | spe | contender | " + " | ".join(
        f"{n} replica{'s' if n > 1 else ''}" for n in (1, 2, 4)) + " |",
             "|---|---|---|---|---|---|"]
    for (model, spe), by_name in sorted(scaling_points(runs).items()):
        for name in ORDER:
            if name not in by_name:
                continue
            rates = dict(by_name[name])
            cells = [model, str(spe), name]
            for count in (1, 2, 4):
                if count not in rates:
                    cells.append("-")
                    continue
                ideal = rates.get(1, 0.0) * count
                share = f" ({rates[count] / ideal:.0%} of ideal)" if ideal and count > 1 else ""
                cells.append(f"{rates[count]:,.0f}{share}")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(runs: List[dict], ratios_path: str, scaling_path: str) -> None:
    """Paired ratios to the hand-written loop (with quartiles), and
    throughput against replica count with the ideal line."""
    import matplotlib  # pylint: disable=import-outside-toplevel

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    labels, series = [], {}
    for run in runs:
        config = run["config"]
        labels.append(f"{config['strategy']}\n{config['model']} spe={config['steps_per_execution']}")
        for name in ORDER:
            ratio = run.get("results", {}).get(name, {}).get("vs_loop")
            series.setdefault(name, []).append(ratio)
    series = {name: values for name, values in series.items() if any(values)}
    figure, axes = plt.subplots(figsize=(max(8, 0.9 * len(labels)), 5))
    width = 0.8 / max(1, len(series))
    for index, (name, values) in enumerate(series.items()):
        xs = [i + index * width for i, v in enumerate(values) if v]
        medians = [v["median"] for v in values if v]
        errors = [[v["median"] - v["p25"] for v in values if v],
                  [v["p75"] - v["median"] for v in values if v]]
        axes.bar(xs, medians, width, yerr=errors, capsize=2, label=name)
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.axhline(0.97, color="gray", linewidth=0.8, linestyle="--")
    axes.set_xticks([i + 0.4 - width / 2 for i in range(len(labels))], labels, fontsize=6)
    axes.set_ylabel("examples/s / hand-written loop's (paired median, quartiles)")
    axes.set_title("Speed relative to a hand-written tf.distribute loop (dashed: 0.97)")
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(ratios_path, dpi=100)
    plt.close(figure)

    points = scaling_points(runs)
    if not points:
        return
    keys = sorted(points)
    figure, grid = plt.subplots(1, len(keys), figsize=(3.6 * len(keys), 3.6), squeeze=False)
    for axes, key in zip(grid[0], keys):
        for name, values in points[key].items():
            axes.plot([n for n, _ in values], [r for _, r in values], marker="o", label=name)
        loop = dict(points[key].get(contenders.REFERENCE, []))
        if 1 in loop:
            counts = sorted({n for values in points[key].values() for n, _ in values})
            axes.plot(counts, [loop[1] * n for n in counts], "k--", linewidth=0.8,
                      label="ideal (loop, 1 replica x N)")
        axes.set_title(f"{key[0]}, spe={key[1]}", fontsize=9)
        axes.set_xlabel("replicas (logical CPUs on 2 cores)")
        axes.set_xticks([1, 2, 4])
    grid[0][0].set_ylabel("examples/s (median)")
    grid[0][0].legend(fontsize=6)
    figure.tight_layout()
    figure.savefig(scaling_path, dpi=100)
    plt.close(figure)
