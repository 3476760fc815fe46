"""The flags every measuring script shares, declared once.

Each benchmark (absl) calls `define_common` with its name and what its
``--quick`` form does; its own flags follow in the script.

    from scripts.bench import flags as bench_flags
    bench_flags.define_common("allreduce_benchmark",
                              quick="2 workers, 1gbit, tiny: every path, no measurement")
"""

from absl import flags


def define_common(name: str, *, quick: str) -> None:
    """``--output_dir`` (default ``/tmp/tfdist_<name>``) and ``--quick``
    (a check that every code path runs, not a measurement: ``quick``)."""
    flags.DEFINE_string("output_dir", f"/tmp/tfdist_{name}", "Where results go.")
    flags.DEFINE_bool("quick", False, f"A check that every path works, not a measurement: {quick}")
