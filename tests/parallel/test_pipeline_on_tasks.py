"""A pipeline with one stage per process: ``tfdist-run --workers_serve``
starts a chief (the training program, the first stage) and worker servers
(one stage each) on 127.0.0.1 with real TF_CONFIGs; the chief's step runs
every stage on its task. Compared with one-device Keras on the same data
(`tests.parallel.test_pipeline`), never with tfdist itself."""

import json

import numpy as np
import pytest

from tests.parallel import test_pipeline as in_process
from tests.programs import pipeline_on_tasks
from tests.support.launcher_harness import LauncherRun

PROGRAM = ["python", "tests/programs/pipeline_on_tasks.py"]


@pytest.mark.parametrize("workers,schedule,micro_batches", [(1, "1f1b", 4), (2, "gpipe", 3)],
                         ids=["2tasks-1f1b-m4", "3tasks-gpipe-m3"])
def test_stages_on_other_processes_equal_one_device(tmp_path, workers, schedule, micro_batches):
    expected = in_process._fit(in_process._model())  # pylint: disable=protected-access
    args = [f"--output_dir={tmp_path / 'out'}", f"--schedule={schedule}",
            f"--micro_batches={micro_batches}"]
    with LauncherRun([f"--num_workers={workers}", "--workers_serve"], PROGRAM + args) as run:
        assert run.wait(timeout=300) == 0, run.output[-4000:]
    result = json.loads((tmp_path / "out" / "chief-0.json").read_text())
    in_process._assert_equal_to(expected, (  # pylint: disable=protected-access
        [np.asarray(w, np.float32) for w in result["weights"]], result["history"],
        result["evaluation"], np.asarray(result["predictions"], np.float32)))
    # Each stage's weights live on its own task: the chief's, then each worker's.
    stages = workers + 1
    cuts = pipeline_on_tasks.CUTS[stages]
    layers = ["h1", "h2", "h3", "out"]
    stage_of = {name: sum(layers.index(cut) < index for cut in cuts)
                for index, name in enumerate(layers)}
    assert [d.split("/device")[0] for d in result["stage_devices"]] == (
        ["/job:chief/replica:0/task:0"]
        + [f"/job:worker/replica:0/task:{i}" for i in range(workers)])
    for path, device in result["devices"].items():
        wanted = result["stage_devices"][stage_of[path.split("/")[0]]]
        assert device == wanted, (path, device, wanted)
