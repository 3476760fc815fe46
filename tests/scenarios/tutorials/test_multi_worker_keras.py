"""Tutorial: Multi-worker training with Keras (2 workers).

Its user code with tfdist's change, against the tutorial's own code on
one device (`tests/support/tutorials.py` says how these tests compare).
Published: tensorflow/docs site/en/tutorials/distribute/multi_worker_with_keras.ipynb
(tests/programs/tutorial_multi_worker_keras.py, 2 workers)
"""

import keras

from tests.support import reference as ref
from tests.support import tutorials
from tests.programs import tutorial_mnist_setup as mnist_setup
from tests.programs import tutorial_multi_worker_keras as keras_program


def test_multi_worker_keras_tutorial_equals_one_device(tmp_path):
    program = keras_program
    global_batch_size = program.PER_WORKER_BATCH_SIZE * 2
    keras.utils.set_random_seed(tutorials.SEED)
    single_worker_dataset = mnist_setup.mnist_dataset(global_batch_size)
    single_worker_model = mnist_setup.build_and_compile_cnn_model()
    history = single_worker_model.fit(single_worker_dataset, epochs=3,
                                      steps_per_epoch=program.STEPS_PER_EPOCH, verbose=0).history
    expected = single_worker_model.get_weights()

    output_dir, _ = tutorials.launch(tmp_path, "tutorial_multi_worker_keras.py", ["--num_workers=2"])
    for result in tutorials.worker_results(output_dir):
        ref.assert_weight_lists_close(expected, result["fit"]["weights"])
        ref.assert_logs_close(history, result["fit"]["history"])
        # Stopped after 2 epochs and restarted: the third epoch, then the same weights.
        ref.assert_weight_lists_close(expected, result["resumed"]["weights"])
        ref.assert_logs_close({key: values[-1:] for key, values in history.items()},
                              result["resumed"]["history"])
        # Plain Keras fit on the same strategy fails (README: "ValueError:
        # Attempt to convert a value (PerReplica...)", measured with arrays).
        assert result["keras_error"] is not None
    # The tutorial's saving code: the chief's file, the other worker's removed.
    saved = keras.models.load_model(output_dir / "keras-model.keras")
    ref.assert_weight_lists_close(expected, saved.get_weights())
    assert not (output_dir / "workertemp_1").exists()
    # The Trainer's checkpoints of both jobs (epochs 1-2, then 3), written by the chief.
    assert sorted(p.name for p in (output_dir / "backup").glob("*.index")) == [
        "ckpt-10.index", "ckpt-15.index", "ckpt-5.index"]
