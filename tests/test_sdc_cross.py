"""Cross-device SDC detection across real device processes (bench/sdc_cross.py): a flip in one
device's own result is caught by the other device's independently computed digest, also where
the device's own ABFT checksums miss it; devices that computed correctly agree bit for bit."""

from __future__ import annotations

from bench import sdc_cross


def test_flip_in_one_device_process_is_caught_by_its_peers():
    r = sdc_cross.measure(n=64, per_bit=1, clean=4, seed=3)
    g = r["groups"]
    print(g, r["round_s"])
    assert r["false_alarms_two_devices"] == 0 and r["false_alarms_three_devices"] == 0
    assert g["all"]["injections"] == 32
    assert g["all"]["two_devices_detected"] == 1.0
    assert g["all"]["three_devices_named"] == 1.0
    # low mantissa flips slip under ABFT's rounding bound: only the peers' digest sees them
    assert g["mantissa"]["abft_alone"] < 1.0
