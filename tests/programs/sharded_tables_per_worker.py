"""A worker program for embedding tables sharded by vocabulary across
processes: tests/communication/test_table_lookups.py's recommender (a user
table and an item-history table), or with ``--family`` one of the
recommender corpus' (`tests.support.recommenders`), under
MultiWorkerMirroredStrategy with
``communication=FullySharded()``, ``--replicas_per_worker`` replicas per
worker: each replica of the cluster keeps a range of each table's rows,
and ids and rows cross between the workers' processes.

Writes ``<output_dir>/<task>.json``: the history, evaluation,
predictions, final weights (the tables whole) and each table's slice
shapes on this worker.
"""

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import tfdist  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--optimizer", default="adam")
    parser.add_argument("--family", default=None,
                        help="a family of tests/support/recommenders.py (default: "
                             "test_table_lookups' recommender)")
    parser.add_argument("--replicas_per_worker", type=int, default=2)
    parser.add_argument("--replicated", action="store_true",
                        help="the tables whole on every replica (no FullySharded)")
    args = parser.parse_args()

    tfdist.strategies.configure_logical_cpus(args.replicas_per_worker)
    strategy = tfdist.make_strategy("multi_worker_mirrored",
                                    num_replicas=args.replicas_per_worker)
    if args.family is None:
        from tests.communication import test_table_lookups as tables  # pylint: disable=import-outside-toplevel

        build, x, y = tables._recommender, *tables._data()  # pylint: disable=protected-access
        batch_size, names = tables.BATCH, ("users", "items_table")
    else:
        from tests.support import recommenders  # pylint: disable=import-outside-toplevel

        family = recommenders.FAMILIES[args.family]
        build, x, y = family.build, *family.data()
        batch_size, names = recommenders.BATCH, family.tables
    with strategy.scope():
        model = build(args.optimizer)
    tfdist.attach(model, strategy, communication=(
        None if args.replicated else tfdist.communication.FullySharded()))
    history = model.fit(x, y, batch_size=batch_size, epochs=2, shuffle=False, verbose=0)
    result = {
        "history": history.history,
        "evaluation": model.evaluate(x, y, batch_size=batch_size, verbose=0, return_dict=True),
        "predictions": model.predict(x, batch_size=batch_size, verbose=0).tolist(),
        "weights": [w.tolist() for w in model.get_weights()],
        "slice_shapes": {name: [c.shape.as_list()
                                for c in model.get_layer(name).embeddings.value.values]
                         for name in names} if not args.replicated else {},
    }
    output = pathlib.Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    (output / f"{tfdist.cluster.task_name()}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
