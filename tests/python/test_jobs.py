"""Jobs from Python: a LocalLauncher starts the C++ calculator as a job of replicas, a pool
calls them, and the job's handle reports, logs and stops them."""

import os

import pytest

import troupe
from conftest import BIN_DIR


def test_a_launched_job_serves_a_pool_and_stops_on_terminate(tmp_path):
    with troupe.LocalLauncher(log_directory=str(tmp_path)) as launcher:
        job = launcher.submit("calc", [os.path.join(BIN_DIR, "calculator_server")], replicas=2,
                              resources=troupe.ResourceConfig.with_cpu(0.1, "64m"))
        assert job.id == "calc"
        group = launcher.resolver().group("calc", "calc")
        assert group.wait_ready(2, timeout=30) == ["calc/calc-0", "calc/calc-1"]
        assert job.status() == "running"
        assert group.pool().call("calc.add", a=2, b=3) == {"value": 5.0}
        replicas = job.replicas()
        assert [r[0] for r in replicas] == [0, 1] and all(r[1] > 0 for r in replicas)
        assert any("calculator serving at" in line for line in job.logs(50))
        job.terminate(grace=10)
        assert job.status() == "stopped"
        assert job.wait(timeout=5) == "stopped"
        # Its end reached the resolver: waiting for its members fails at once.
        with pytest.raises(troupe.JobEnded):
            group.wait_ready(2, timeout=30)


def test_a_job_that_fails_says_why(tmp_path):
    with troupe.LocalLauncher(log_directory=str(tmp_path)) as launcher:
        job = launcher.submit("broken", ["/bin/sh", "-c", "exit 3"], replicas=1)
        assert job.wait(timeout=30) == "failed"
        assert "3" in job.reason()


def test_bad_requests_and_resources_are_invalid_arguments(tmp_path):
    with pytest.raises(troupe.InvalidArgument):
        troupe.ResourceConfig.with_cpu(1, "lots")
    gpu = troupe.ResourceConfig.with_gpu("H100", 8)
    assert gpu.chip_count == 8 and gpu.cpu == 8
    with troupe.LocalLauncher(log_directory=str(tmp_path), gpus=0) as launcher:
        with pytest.raises(troupe.InvalidArgument):
            launcher.submit("bad name", ["/bin/true"])
        with pytest.raises(troupe.InvalidArgument):
            launcher.submit("empty", [])
        job = launcher.submit("needs-gpus", ["/bin/true"], resources=gpu)
        assert job.status() == "unschedulable"
        launcher.submit("again", ["/bin/sleep", "30"])
        with pytest.raises(troupe.JobAlreadyExists):
            launcher.submit("again", ["/bin/sleep", "30"])
