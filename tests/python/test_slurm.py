"""troupe.SlurmLauncher on the one-node cluster of scripts/slurm-local.sh (real munged, slurmctld
and slurmd; ctest starts it and SLURM_CONF names it): the C++ calculator as a Slurm job of two
tasks, called through a pool from Python, seen by Slurm's own squeue, and ended by terminate();
a request Slurm refuses is unschedulable at once. ctest's python.slurm runs it; python.client
leaves it out."""

import os
import subprocess

import pytest

import troupe
from conftest import BIN_DIR

# Slurm schedules, and its tasks start, in its own time.
PATIENCE = 60

def launcher(registry, tmp_path):
    return troupe.SlurmLauncher(registry, log_directory=str(tmp_path / "logs"),
                                terminate_grace=5, poll_initial=0.1, poll_max=1)


def test_a_slurm_job_serves_a_pool_and_ends_on_terminate(registry, tmp_path):
    with launcher(registry, tmp_path) as slurm:
        assert slurm.resolver_url == registry
        job = slurm.submit("pycalc", [os.path.join(BIN_DIR, "calculator_server")], replicas=2,
                           resources=troupe.ResourceConfig.with_cpu(1, "64m"))
        group = slurm.resolver().group("pycalc", "calc")
        assert group.wait_ready(2, timeout=PATIENCE) == ["pycalc/calc-0", "pycalc/calc-1"]
        pool = group.pool()
        assert pool.call("calc.add", a=20, b=22) == {"value": 42.0}

        # Slurm itself runs it, as the job the launcher names.
        slurm_id = slurm.slurm_job_id("pycalc")
        assert slurm_id > 0
        shown = subprocess.run(["squeue", "--noheader", "--name=pycalc", "--format=%i"],
                               capture_output=True, text=True, check=True).stdout.split()
        assert shown == [str(slurm_id)]

        job.terminate(grace=5)
        assert job.status() == "stopped"
        assert job.reason() == "terminated"
        with pytest.raises(troupe.JobEnded):
            group.wait_ready(1, timeout=PATIENCE)


def test_a_group_of_python_actors_runs_as_a_slurm_job(registry, tmp_path):
    import numpy as np
    from py_actors import ParameterServer

    with launcher(registry, tmp_path) as slurm:
        group = slurm.create_actor_group(ParameterServer, name="pyps", count=2, args=(8,),
                                         resources=troupe.ResourceConfig.with_cpu(1, "256m"))
        assert group.wait_ready(2, timeout=PATIENCE) == ["pyps/pyps-0", "pyps/pyps-1"]
        assert slurm.slurm_job_id("pyps") > 0
        pool = group.pool()
        assert pool.call("push", np.ones(8, np.float32)) == 1
        norms = sorted(r.value["norm"] for r in pool.broadcast("stats").wait_all(timeout=10))
        assert norms == [0.0, pytest.approx(np.linalg.norm(np.full(8, 0.1)))]
        group.close(grace=5)
        assert group.launched.status() == "stopped"


def test_a_partition_slurm_lacks_is_unschedulable_at_once(registry, tmp_path):
    with troupe.SlurmLauncher(registry, partition="nowhere",
                              log_directory=str(tmp_path / "logs")) as slurm:
        job = slurm.submit("nowhere", ["/bin/true"])
        assert job.wait(timeout=PATIENCE) == "unschedulable"
        assert "invalid partition" in job.reason().lower()
        assert slurm.slurm_job_id("nowhere") == 0


def test_a_launcher_without_a_resolver_is_an_invalid_argument(tmp_path):
    with pytest.raises(troupe.InvalidArgument):
        troupe.SlurmLauncher("", log_directory=str(tmp_path))
