"""What runs in the lab, shared by the benchmarks (bench/) and the demo (demo/): the PEP or the
end-to-end path for the lab's clients, the access link's profile, downloads and uploads, and the
responsiveness run (small requests on a fixed schedule beside a bulk download).

Each is bounded in time: transfers give up after their cap, the probe after its seconds.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time

from linkem import profiles as link_profiles

from .addresses import ACCESS_NET4, CLIENT4, ORIGIN4, ORIGIN_URL4
from .handle import PYTHON, REPO, LabHandle

OBJECTS = {1: "1m", 10: "10m", 50: "50m"}     # MB -> the lab origin's object
PROBE_INTERVAL = 0.2   # a 1 KB request every 200 ms, on a connection of its own
PAGE = [f"{ORIGIN_URL4}/{obj}?{i}" for i, obj in enumerate(["100k"] * 10 + ["1k"] * 20)]   # 30 objects, about 1 MB


def set_link(lab: LabHandle, rtt_ms: float, loss: float, rate_mbit: float) -> None:
    """Half the RTT each way; a buffer of one RTT at the rate (limit_ms), loss both ways."""
    proc = lab.run_pep_lab("link", "none", f"delay={rtt_ms / 2:g}", f"loss={loss:g}", f"down.rate={rate_mbit:g}M",
                           f"up.rate={rate_mbit:g}M", f"limit_ms={max(rtt_ms, 20):g}")
    assert proc.returncode == 0, proc.stderr


def link_words(profile: str) -> list[str]:
    """What `pep-lab link` takes for a profile: its name, or for trace:PATH (linkem.profiles.recording)
    the words of PATH's traces."""
    rec = link_profiles.recording(profile)
    if rec is None:
        return [profile]
    return ["none", *(f"{side}.trace={rec[side]['trace']}" for side in ("down", "up")),
            *(f"{k}={v}" for k, v in rec["both"].items())]


def profile_label(profile: str) -> str:
    """A profile's name in a report: trace:PATH is PATH's file name."""
    return os.path.basename(profile) if profile.startswith(link_profiles.RECORDING_PREFIX) else profile


def set_profile(lab: LabHandle, profile: str) -> None:
    """The access link's profile (linkem/profiles.toml, or trace:PATH); set again, a trace starts over."""
    proc = lab.run_pep_lab("link", *link_words(profile))
    assert proc.returncode == 0, proc.stderr


def set_mode(lab: LabHandle, mode: str) -> None:
    """e2e: bypass every lab client (new flows only); proxy: no bypass rule."""
    action = "add" if mode == "e2e" else "del"
    lab.pepctl("bypass", action, "client", ACCESS_NET4)


def download(lab: LabHandle, obj: str, cap: float) -> dict:
    out = lab.run("client", "curl", "-s", "-o", "/dev/null", "-m", f"{cap:g}", "-w",
                  "%{size_download} %{time_total}", f"{ORIGIN_URL4}/{obj}", check=False,
                  timeout=cap + 30).stdout.split()
    size, secs = int(out[0]), float(out[1])
    return {"bytes": size, "seconds": secs, "mbps": size * 8 / secs / 1e6 if secs else 0.0}


def upload(lab: LabHandle, size_mb: int, cap: float) -> dict:
    src = os.path.join(lab.run_dir, "www", OBJECTS[size_mb])
    out = lab.run("client", "curl", "-s", "-o", "/dev/null", "-m", f"{cap:g}", "-T", src, "-w",
                  "%{size_upload} %{time_total} %{http_code}", f"{ORIGIN_URL4}/upload/{size_mb}m",
                  check=False, timeout=cap + 30).stdout.split()
    size, secs = int(out[0]), float(out[1])
    return {"bytes": size, "seconds": secs, "mbps": size * 8 / secs / 1e6 if secs else 0.0}


def percentile(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))] if s else float("nan")


def small_percentiles(times: list[float]) -> dict:
    return {f"small_p{p}_ms": percentile(times, p) * 1000 for p in (50, 95, 99)}


def one_run(lab: LabHandle, seconds: float, load: bool = True, bbr_estimates: bool = False) -> dict:
    """Small requests on a fixed schedule; with load, the bulk download beside them and a page load 3 s in.
    bbr_estimates: also BBR's bandwidth estimate of the download's socket toward the client, every 0.5 s."""
    bulk = lab.popen("client", "curl", "-s", "-o", "/dev/null", "-m", f"{seconds:g}", "-w",
                     "%{size_download} %{time_total}", f"{ORIGIN_URL4}/1g") if load else None
    probe = lab.popen("client", PYTHON, "-m", "netns.probe_requests", ORIGIN4, "--seconds", f"{seconds - 1:g}",
                      "--interval", f"{PROBE_INTERVAL:g}", cwd=REPO)
    received: list[tuple[float, int]] = []   # (offset s, bytes the client has received)
    stop = threading.Event()
    sampler = threading.Thread(target=sample_received, args=(lab, received, stop))
    sampler.start()
    estimates: list[float] = []
    estimator = threading.Thread(target=sample_bbr_bw, args=(lab, estimates, stop)) if bbr_estimates else None
    if estimator:
        estimator.start()
    page_s = float("nan")
    if load:
        time.sleep(3)
        t = time.monotonic()
        try:   # (-m bounds each object, not the page: on a dead link the page would outlast the run)
            out = lab.run("client", "curl", "-s", "--parallel", "--parallel-max", "6", "-m", f"{seconds:g}",
                          *[a for u in PAGE for a in ("-o", "/dev/null", u)], check=False, timeout=seconds + 30)
            page_s = time.monotonic() - t if out.returncode == 0 else float("nan")
        except subprocess.TimeoutExpired:
            page_s = float("nan")   # not loaded within the run and its grace: as a failed load
    probed = json.loads(probe.communicate(timeout=seconds + 30)[0])
    bulk_mbps = 0.0
    if bulk is not None:
        size, secs = (float(x) for x in bulk.communicate(timeout=seconds + 30)[0].split())
        bulk_mbps = size * 8 / secs / 1e6 if secs else 0.0
    stop.set()
    sampler.join()
    if estimator:
        estimator.join()
    times = [x for _, x in probed["samples"]]
    return {"bulk_mbps": bulk_mbps, **small_percentiles(times), "small_count": len(times), "bbr_bw_mbps": estimates,
            "small_failed": probed["failed"], "page_s": page_s, "small_series": probed["samples"],
            "goodput_series": rate_series(received)}


def sample_received(lab: LabHandle, into: list, stop: threading.Event) -> None:
    """Every 500 ms, the bytes the client's interfaces have received (/proc/net/dev of its netns)."""
    started = time.monotonic()
    while not stop.wait(0.5):
        lines = lab.run("client", "cat", "/proc/net/dev").stdout.splitlines()[2:]
        names_counters = [line.split(":", 1) for line in lines]
        into.append((time.monotonic() - started,
                     sum(int(counters.split()[0]) for name, counters in names_counters if name.strip() != "lo")))


BBR_BW = re.compile(r"bbr:\(bw:([\d.]+)([KMG]?)bps")


def sample_bbr_bw(lab: LabHandle, into: list, stop: threading.Event) -> None:
    """Every 500 ms, the largest BBR bandwidth estimate (Mbit/s) among the proxy's sockets toward the
    client: the download's (`ss -tin` in the graph's namespace, entered with nsenter)."""
    argv = ["nsenter", f"--net=/run/netns/{lab.netns('pep')}", "ss", "-tin", "dst", CLIENT4]
    scale = {"": 1e-6, "K": 1e-3, "M": 1.0, "G": 1e3}
    while not stop.wait(0.5):
        out = subprocess.run(argv, capture_output=True, text=True).stdout
        found = [float(v) * scale[unit] for v, unit in BBR_BW.findall(out)]
        if found:
            into.append(max(found))


def rate_series(received: list[tuple[float, int]]) -> list[list[float]]:
    """(offset s, Mbit/s) between consecutive samples."""
    return [[round(t1, 2), round((b1 - b0) * 8 / (t1 - t0) / 1e6, 3)]
            for (t0, b0), (t1, b1) in zip(received, received[1:], strict=False)]
