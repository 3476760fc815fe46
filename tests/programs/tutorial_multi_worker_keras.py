"""TensorFlow's "Multi-worker training with Keras" tutorial, adopted with tfdist
(tensorflow/docs, site/en/tutorials/distribute/multi_worker_with_keras.ipynb:
its ``main.py``, the model-saving section and the BackupAndRestore section).

Run by tests/scenarios/tutorials/test_multi_worker_keras.py under ``tfdist-run --num_workers=2``. The
tutorial's code, with each change marked:

- ``# tfdist:`` ``tfdist.make_strategy("multi_worker_mirrored")`` for
  ``tf.distribute.MultiWorkerMirroredStrategy()``; ``tfdist.attach`` after
  the model is built; the Trainer's ``checkpoint_dir`` (one writer, the
  chief) for Keras' ``BackupAndRestore``, which writes from every worker.
- ``# Keras 3:`` a ``.keras`` file name for ``model.save``.
- ``# test:`` smaller sizes (per-worker batch 16, 5 steps per epoch), a
  seeded shuffle, and the "restart" of the BackupAndRestore section done as a
  second job in the same process (a new model and dataset, the same
  directory).

Before the tutorial, plain Keras ``fit`` is tried on the same strategy (as
scripts/keras_vs_tfdist.py does) and its error is recorded. Writes
``<output_dir>/<task>.json``.
"""

import argparse
import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import tfdist  # noqa: E402

STEPS_PER_EPOCH = 5  # the tutorial: 70
PER_WORKER_BATCH_SIZE = 16  # the tutorial: 64


# -- the tutorial's model-saving helpers, verbatim -------------------------------


def _is_chief(task_type, task_id):
    # Note: there are two possible `TF_CONFIG` configurations.
    #   1) In addition to `worker` tasks, a `chief` task type is use;
    #      in this case, this function should be modified to
    #      `return task_type == 'chief'`.
    #   2) Only `worker` task type is used; in this case, worker 0 is
    #      regarded as the chief. The implementation demonstrated here
    #      is for this case.
    # For the purpose of this Colab section, the `task_type` is `None` case
    # is added because it is effectively run with only a single worker.
    return (task_type == 'worker' and task_id == 0) or task_type is None


def _get_temp_dir(dirpath, task_id):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    base_dirpath = 'workertemp_' + str(task_id)
    temp_dir = os.path.join(dirpath, base_dirpath)
    tf.io.gfile.makedirs(temp_dir)
    return temp_dir


def write_filepath(filepath, task_type, task_id):
    dirpath = os.path.dirname(filepath)
    base = os.path.basename(filepath)
    if not _is_chief(task_type, task_id):
        dirpath = _get_temp_dir(dirpath, task_id)
    return os.path.join(dirpath, base)


def _plain(values):
    return [w.tolist() for w in values]


def _keras_alone(strategy, mnist_setup, global_batch_size) -> str:
    """Plain Keras ``fit`` under the same strategy: its error, or None."""
    import keras  # pylint: disable=import-outside-toplevel

    keras.utils.set_random_seed(mnist_setup.SEED)
    dataset = mnist_setup.mnist_dataset(global_batch_size)
    with strategy.scope():
        model = mnist_setup.build_and_compile_cnn_model()
    try:
        model.fit(dataset, epochs=1, steps_per_epoch=2, verbose=0)
    except Exception as error:  # pylint: disable=broad-except
        return f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300]}"
    return None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", required=True)
    args = parser.parse_args()
    os.makedirs(args.output_dir, exist_ok=True)
    results = {}

    # -- main.py ----------------------------------------------------------------
    per_worker_batch_size = PER_WORKER_BATCH_SIZE
    tf_config = json.loads(os.environ['TF_CONFIG'])
    num_workers = len(tf_config['cluster']['worker'])

    # tfdist: was strategy = tf.distribute.MultiWorkerMirroredStrategy()
    strategy = tfdist.make_strategy("multi_worker_mirrored")

    import keras  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from tests.programs import tutorial_mnist_setup as mnist_setup  # the tutorial's mnist_setup.py

    global_batch_size = per_worker_batch_size * num_workers
    results["keras_error"] = _keras_alone(strategy, mnist_setup, global_batch_size)

    keras.utils.set_random_seed(mnist_setup.SEED)  # test: the one-device reference's weights
    multi_worker_dataset = mnist_setup.mnist_dataset(global_batch_size)

    with strategy.scope():
        # Model building/compiling need to be within `strategy.scope()`.
        multi_worker_model = mnist_setup.build_and_compile_cnn_model()
    tfdist.attach(multi_worker_model, strategy)  # tfdist: the one added line

    history = multi_worker_model.fit(multi_worker_dataset, epochs=3,
                                     steps_per_epoch=STEPS_PER_EPOCH)
    results["fit"] = {"history": history.history,
                      "weights": _plain(multi_worker_model.get_weights())}

    # -- Model saving and loading -------------------------------------------------
    model_path = os.path.join(args.output_dir, 'keras-model.keras')  # Keras 3: '.keras'
    task_type, task_id = (strategy.cluster_resolver.task_type,
                          strategy.cluster_resolver.task_id)
    write_model_path = write_filepath(model_path, task_type, task_id)
    multi_worker_model.save(write_model_path)
    if not _is_chief(task_type, task_id):
        tf.io.gfile.rmtree(os.path.dirname(write_model_path))

    # -- BackupAndRestore ------------------------------------------------------------
    # The tutorial: callbacks = [tf.keras.callbacks.BackupAndRestore(backup_dir='/tmp/backup')]
    # tfdist: Keras' callback writes from every worker; the Trainer's
    # checkpoint_dir is written by the chief only, restored by every worker,
    # and `epochs` is the total the run should reach, as with BackupAndRestore.
    backup_dir = os.path.join(args.output_dir, 'backup')
    keras.utils.set_random_seed(mnist_setup.SEED)
    multi_worker_dataset = mnist_setup.mnist_dataset(global_batch_size)
    with strategy.scope():
        multi_worker_model = mnist_setup.build_and_compile_cnn_model()
    tfdist.attach(multi_worker_model, strategy,  # tfdist
                  checkpointing=tfdist.CheckpointOptions(backup_dir))
    multi_worker_model.fit(multi_worker_dataset, epochs=2, steps_per_epoch=STEPS_PER_EPOCH)
    # test: the job stops after 2 epochs; a restarted job (a new model, a new
    # dataset object, the same directory) trains the third epoch only.
    # The restarted script seeds as the first did, so its seeded shuffle
    # draws the same orders (the global seed is part of a shuffle's seed).
    keras.utils.set_random_seed(mnist_setup.SEED)
    multi_worker_dataset = mnist_setup.mnist_dataset(global_batch_size)
    keras.utils.set_random_seed(mnist_setup.SEED + 1)  # other initial weights: restored over
    with strategy.scope():
        multi_worker_model = mnist_setup.build_and_compile_cnn_model()
    tfdist.attach(multi_worker_model, strategy,  # tfdist
                  checkpointing=tfdist.CheckpointOptions(backup_dir))
    history = multi_worker_model.fit(multi_worker_dataset, epochs=3,
                                     steps_per_epoch=STEPS_PER_EPOCH)
    results["resumed"] = {"history": history.history,
                          "weights": _plain(multi_worker_model.get_weights())}

    with open(os.path.join(args.output_dir, f"{tfdist.cluster.task_name()}.json"), "w",
              encoding="utf-8") as out:
        json.dump(results, out)


if __name__ == "__main__":
    main()
