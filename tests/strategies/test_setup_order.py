"""Set-up in any order (issue 33, point 6): a strategy works after
TensorFlow started when the devices it has suffice; otherwise the error
names the line that started the runtime (`tfdist._internal.runtime_start`).

Each case is a fresh Python process: the runtime starts once per process.
"""

import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(tmp_path, source: str):
    script = tmp_path / "tutorial.py"
    script.write_text(textwrap.dedent(source))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=REPO)
    process = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, output


@pytest.mark.parametrize("imports", ["import tfdist\nimport tensorflow as tf",
                                     "import tensorflow as tf\nimport tfdist"],
                         ids=["tfdist first", "tensorflow first"])
def test_too_late_for_logical_devices_names_the_line_that_started_the_runtime(
        tmp_path, imports):
    code, output = _run(tmp_path, imports + """
examples = tf.data.Dataset.range(8).batch(4)  # the tutorial loads its data first
strategy = tfdist.make_strategy("mirrored", num_replicas=2)
""")
    assert code != 0
    assert "RuntimeAlreadyStartedError" in output, output[-3000:]
    assert 'tutorial.py", line 3' in output and "examples = tf.data.Dataset.range(8)" in output, \
        output[-3000:]
    assert "after tfdist.make_strategy" in output


def test_the_official_tutorials_order_works_when_the_devices_suffice(tmp_path):
    """Data first, then the strategy: on a CPU-only machine the mirrored
    strategy takes the one CPU, as tf.distribute.MirroredStrategy() does."""
    code, output = _run(tmp_path, """
import tensorflow as tf
import keras
import tfdist
examples = tf.data.Dataset.from_tensor_slices(
    (tf.random.normal([64, 4]), tf.zeros([64], tf.int64))).batch(16)
strategy = tfdist.make_strategy("mirrored")
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
tfdist.attach(model, strategy)
model.fit(examples, epochs=1, verbose=0)
print("replicas", strategy.num_replicas_in_sync)
""")
    assert code == 0, output[-3000:]
    assert "replicas 1" in output


def test_a_runtime_started_before_tfdist_was_imported_gets_the_general_advice(tmp_path):
    code, output = _run(tmp_path, """
import tensorflow as tf
examples = tf.data.Dataset.range(8)
import tfdist
tfdist.make_strategy("mirrored", num_replicas=2)
""")
    assert code != 0 and "RuntimeAlreadyStartedError" in output, output[-3000:]
    assert "before `import tfdist` could see where" in output


def test_gpus_that_fail_to_initialise_are_a_warning_with_tensorflows_reason(tmp_path):
    """This machine has no GPU: TensorFlow's real start-up lines about CUDA
    are captured, and the check is told the driver's device files exist
    (what `nvidia_gpus_present` reads on a GPU machine)."""
    code, output = _run(tmp_path, """
import warnings
import tfdist
from tfdist.strategies import local_devices
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert local_devices.physical_devices("GPU") == []
    assert not caught, [str(w.message) for w in caught]  # no NVIDIA device files here
    assert local_devices.warn_if_gpus_failed(present="/dev/nvidia0")
print("WARNING:", caught[0].category.__name__, caught[0].message)
""")
    assert code == 0, output[-3000:]
    assert "WARNING: RuntimeWarning This machine has NVIDIA GPUs (/dev/nvidia0)" in output
    assert "TensorFlow said:" in output and "cuda" in output.split("TensorFlow said:")[1].lower()


def test_gpus_hidden_on_purpose_are_no_warning(monkeypatch):
    from tfdist.strategies import local_devices

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert local_devices.nvidia_gpus_present() is None
