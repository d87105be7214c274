"""tools.daso_sweep without its runs: the variants it builds, the runs it asks for and its table."""

from __future__ import annotations

import pytest

from benchmarks.virtual import network
from tools import daso_sweep


def test_each_variant_changes_one_parameter_of_the_preset():
    base, nets = network.load("juwels_booster_heat"), daso_sweep.variants()
    assert nets["fitted"] == base
    assert nets["fair"].mpi_for_all and not base.mpi_for_all
    assert nets["overlap 0"].mpi_overlap == 0.0 and base.mpi_overlap == pytest.approx(0.78)
    assert nets["mpi x2"].mpi.bandwidth_bps == 2 * base.mpi.bandwidth_bps
    assert nets["mpi x0.5"].mpi.bandwidth_bps == 0.5 * base.mpi.bandwidth_bps


def test_the_sweep_reuses_horovods_fitted_run_unless_horovod_is_on_mpi(tmp_path, monkeypatch):
    """Horovod's groups go at MPI's pace only under mpi_for_all: the other variants read the fitted
    Horovod run. Speed-up = Horovod's time / DASO's; the factor = 1.33 / speed-up."""
    asked = []

    def fake_run(algorithm, nodes, net_file, out):
        asked.append((algorithm, out.parent.name, nodes))
        net = network.load(str(net_file))
        if algorithm == "horovod":
            return 200.0 if net.mpi_for_all else 100.0
        return 80.0 if net.mpi_overlap == 0.0 else 100.0

    monkeypatch.setattr(daso_sweep, "run", fake_run)
    table = daso_sweep.sweep([4], tmp_path, ["fitted", "fair", "overlap 0"]).set_index("variant")
    assert sorted(a for a in asked if a[0] == "horovod") == [("horovod", "fair", 4), ("horovod", "fitted", 4)]
    assert table.loc["fitted", "speedup"] == 1.0 and table.loc["fitted", "horovod_factor_for_paper"] == 1.33
    assert table.loc["fair", "speedup"] == 2.0
    assert table.loc["overlap 0", "speedup"] == 1.25  # the fitted Horovod over DASO with free hidden syncs
    assert (tmp_path / "daso_sweep.csv").is_file()
