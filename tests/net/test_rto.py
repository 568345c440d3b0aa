"""RFC 6298 estimator: first sample, smoothing, bounds, backoff, deadlines."""

from __future__ import annotations

import pytest

from node import const
from node.net import RtoEstimator


def test_initial_rto_before_any_sample():
    assert RtoEstimator().rto_s == const.RTO_INITIAL_S


def test_first_sample_sets_srtt_and_rttvar(monkeypatch):
    monkeypatch.setattr(const, "RTO_MIN_S", 0.0)
    est = RtoEstimator()
    est.observe(0.100)
    assert est.srtt_s == pytest.approx(0.100)
    assert est.rttvar_s == pytest.approx(0.050)
    assert est.rto_s == pytest.approx(0.100 + 4 * 0.050)  # §2.2


def test_subsequent_samples_smooth(monkeypatch):
    monkeypatch.setattr(const, "RTO_MIN_S", 0.0)
    est = RtoEstimator()
    est.observe(0.100)
    est.observe(0.200)
    rttvar = 0.75 * 0.050 + 0.25 * abs(0.100 - 0.200)
    srtt = 0.875 * 0.100 + 0.125 * 0.200
    assert est.rttvar_s == pytest.approx(rttvar)
    assert est.srtt_s == pytest.approx(srtt)
    assert est.rto_s == pytest.approx(srtt + 4 * rttvar)


def test_rto_is_bounded():
    est = RtoEstimator()
    for _ in range(50):
        est.observe(0.0001)
    assert est.rto_s == const.RTO_MIN_S
    est.observe(1000.0)
    assert est.rto_s == const.RTO_MAX_S


def test_backoff_doubles_until_the_maximum_and_a_sample_resets_it():
    est = RtoEstimator()
    est.observe(0.5)
    base = est.rto_s
    assert est.backoff() == pytest.approx(2 * base)
    assert est.backoff() == pytest.approx(4 * base)
    for _ in range(20):
        est.backoff()
    assert est.rto_s == const.RTO_MAX_S
    est.observe(0.5)
    assert est.rto_s < const.RTO_MAX_S and est.backoffs == 0


def test_deadline_of_consecutive_timeouts():
    est = RtoEstimator()
    est.observe(0.05)  # rto clamps to RTO_MIN_S = 0.2
    assert est.deadline_s(3) == pytest.approx(0.2 + 0.4 + 0.8)
    assert est.deadline_s(3, floor_s=0.5) == pytest.approx(0.5 + 1.0 + 2.0)


def test_restart_drops_the_backoff_but_keeps_the_estimate():
    est = RtoEstimator()
    est.observe(0.5)
    base = est.rto_s
    est.backoff()
    est.backoff()
    est.restart()
    assert est.rto_s == pytest.approx(base) and est.backoffs == 0
    fresh = RtoEstimator()
    fresh.backoff()
    fresh.restart()
    assert fresh.rto_s == const.RTO_INITIAL_S
