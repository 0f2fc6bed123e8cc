"""Host tuning for a proxy host, each step skipped with a notice where the hardware lacks it.

The Netdev talk found pinning the NIC's queues and the proxy to the NIC's
NUMA node worth 4x. Three things, each switchable in [host.tuning]:
  irq_affinity   the NIC's queue interrupts on the CPUs of its NUMA node
  rss_symmetric  a symmetric RSS hash key: both directions of a flow on one queue
  sysctls        the host-wide backlog and buffer limits a busy proxy needs
Every change records the previous value, and `down` puts it back.
"""

from __future__ import annotations

import os
import shlex

from .config import Config
from .hostinfo import HostInfo, read
from .runner import Call, Step, action, note, run

# A repeating 0x6d5a key makes the Toeplitz hash symmetric (Woo and Park, 2012).
SYMMETRIC_KEY = ":".join(["6d", "5a"] * 26)

HOST_SYSCTLS = [
    # Packets queued per CPU between the NIC and the stack (default 1000).
    ("net.core.netdev_max_backlog", "250000"),
    # Upper bounds for socket buffers that HAProxy and long-RTT clients use.
    ("net.core.rmem_max", "33554432"),
    ("net.core.wmem_max", "33554432"),
]


@action("write_proc")
def _write_proc(path: str, value: str) -> None:
    """Writes a /proc file in place (procfs has no rename)."""
    with open(path, "w") as f:
        f.write(value)


def _echo(path: str, value: str) -> Call:
    return Call("write_proc", (path, value), f"echo {shlex.quote(value)} > {path}")


def nic_irqs(info: HostInfo) -> list[int]:
    if not info.nic_bus:
        return []
    try:
        return sorted(int(i) for i in os.listdir(f"/sys/bus/pci/devices/{info.nic_bus}/msi_irqs"))
    except OSError:
        return []


def irq_steps(cfg: Config, info: HostInfo) -> list[Step]:
    irqs = nic_irqs(info)
    if not irqs:
        return [note("IRQ pinning", f"{cfg.host.nic} has no interrupts of its own (virtual NIC): "
                                    "IRQ pinning skipped")]
    cpus = ",".join(map(str, info.cpus))
    steps = []
    for irq in irqs:
        path = f"/proc/irq/{irq}/smp_affinity_list"
        old = read(path)
        if old is None:
            continue
        steps.append(Step(f"pin IRQ {irq} of {cfg.host.nic} to CPUs {cpus}", _echo(path, cpus),
                          undo=_echo(path, old)))
    return steps


def rss_steps(cfg: Config) -> list[Step]:
    nic = cfg.host.nic
    proc = run(["ethtool", "-x", nic], check=False)
    if proc.returncode != 0 or "RSS hash key" not in proc.stdout:
        return [note("symmetric RSS", f"{nic} has no RSS indirection or hash key (veth, or a "
                                      "single-queue NIC): symmetric RSS key skipped")]
    lines = proc.stdout.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("RSS hash key"))
    old = "".join(line.strip() for line in lines[i + 1:] if ":" in line and "RSS" not in line and
                  all(len(x) == 2 for x in line.strip().split(":")))
    if not old or len(old.split(":")) != len(SYMMETRIC_KEY.split(":")):
        return [note("symmetric RSS", f"{nic}'s RSS key is not 52 bytes: symmetric key skipped")]
    return [Step(f"symmetric RSS hash key on {nic}", ["ethtool", "-X", nic, "hkey", SYMMETRIC_KEY],
                 undo=["ethtool", "-X", nic, "hkey", old])]


def sysctl_steps() -> list[Step]:
    steps = []
    for key, value in HOST_SYSCTLS:
        old = read("/proc/sys/" + key.replace(".", "/"))
        if old is None:
            steps.append(note(f"sysctl {key}", f"{key} does not exist here: skipped"))
        elif int(old.split()[0]) >= int(value):
            continue   # already at least as high: leave the operator's value alone
        else:
            steps.append(Step(f"sysctl {key}={value} (was {old})", ["sysctl", "-q", "-w", f"{key}={value}"],
                              undo=["sysctl", "-q", "-w", f"{key}={old}"]))
    return steps


def tuning_steps(cfg: Config, info: HostInfo) -> list[Step]:
    t = cfg.host.tuning
    return [*(irq_steps(cfg, info) if t.irq_affinity else []),
            *(rss_steps(cfg) if t.rss_symmetric else []),
            *(sysctl_steps() if t.sysctls else [])]
