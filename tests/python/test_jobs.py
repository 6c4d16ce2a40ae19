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


def test_the_resolver_lists_its_jobs_with_their_launcher_and_ready_replicas(tmp_path):
    with troupe.LocalLauncher(log_directory=str(tmp_path)) as launcher:
        resolver = launcher.resolver()
        job = launcher.submit("calc", [os.path.join(BIN_DIR, "calculator_server")], replicas=2,
                              resources=troupe.ResourceConfig.with_cpu(0.1, "64m"))
        broken = launcher.submit("broken", ["/bin/sh", "-c", "exit 3"], replicas=1)
        resolver.group("calc", "calc").wait_ready(2, timeout=30)
        assert broken.wait(timeout=30) == "failed"
        jobs = {j["name"]: j for j in resolver.jobs()}
        assert sorted(jobs) == ["broken", "calc"]
        calc = jobs["calc"]
        assert (calc["state"], calc["launcher"], calc["replicas"], calc["ready"],
                calc["endpoints"], calc["ended_at"]) == ("running", "local", 2, 2, 2, None)
        assert calc["created_at"] > 0
        failed = jobs["broken"]
        assert (failed["state"], failed["launcher"], failed["replicas"], failed["ready"]) == (
            "failed", "local", 1, 0)
        assert failed["reason"].startswith("failed: replica 0") and "status 3" in failed["reason"]
        assert failed["ended_at"] >= failed["created_at"]
        job.terminate(grace=10)
        calc = {j["name"]: j for j in resolver.jobs()}["calc"]
        assert (calc["state"], calc["ready"], calc["endpoints"]) == ("stopped", 0, 0)
        assert calc["ended_at"] >= calc["created_at"]
