"""A network file of one's own: the shipped example loads with its units, a bandwidth in bits is
warned about, and a wrong file's error shows the expected form."""

from __future__ import annotations

import json

import pytest

from benchmarks import config
from benchmarks.virtual import network


def test_the_example_network_file_loads_with_its_units():
    net = network.load(str(network.EXAMPLE))
    assert net.inter.bandwidth_bps == 12.5e9  # 100 Gbit/s in bytes per second
    assert net.inter.latency_s == 2e-6 and net.intra.bandwidth_bps == 150e9
    assert "BYTES per second" in net.sources["units"]
    assert network.looks_like_bits(net) == []


def test_a_bandwidth_written_in_bits_is_warned_about(tmp_path):
    d = json.loads(network.EXAMPLE.read_text())
    d["inter"]["bandwidth_bps"] = 200e9  # 200 Gbit/s written as bits: 25 GB/s meant
    path = tmp_path / "bits.json"
    path.write_text(json.dumps(d))
    (line,) = network.looks_like_bits(network.load(str(path)))
    assert line.startswith("inter:") and "divide it by 8 (2.5e+10)" in line
    with pytest.warns(UserWarning, match="inter: bandwidth_bps 2e\\+11 is 200 GB/s"):
        config.resolve("allreduce", "digits", 2, 1, 0, tmp_path / "run", ["clock=simulated", f"sim_network={path}"])


def test_a_wrong_network_file_names_the_expected_form(tmp_path):
    path = tmp_path / "net.json"
    path.write_text(json.dumps({"name": "mine", "intra": {"latency": 1e-6, "bandwidth_bps": 1e9}}))
    with pytest.raises(config.ConfigError) as error:
        config.resolve("allreduce", "digits", 2, 1, 0, tmp_path / "run", ["clock=simulated", f"sim_network={path}"])
    message = str(error.value)
    assert "config/networks/example.json" in message and '"bandwidth_bps": bytes per second' in message
    with pytest.raises(ValueError, match="choose one of juwels_booster.*config/networks/example.json"):
        network.load(str(tmp_path / "missing.json"))
