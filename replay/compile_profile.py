#!/usr/bin/env python3
"""Compile TRex profiles to the JSON that TRex itself sends to its server.

    compile_profile.py PROFILE.py OUT.json [PROFILE2.py OUT2.json ...] [-t KEY=VALUE ...]

ASTF profiles (a module whose register() object has get_profile()) are written exactly as
ASTFProfile.to_json() returns them: buf_list, ip_gen_dist_list, program_list, templates. That file
is pep-replay's input (`pep-replay client|server --profile OUT.json`).

STL profiles (get_streams()) are written as {"type": "stl", "directions": {"0": [...], "1": [...]}}:
the STLStream.to_json() list TRex would load on a port of each direction (port 0 = access side,
port 1 = origin side). pep-replay does not play STL; this is for inspection and the tests.

Uses the TRex client library from PyPI (lbr-trex-client). It bundles its own scapy and puts it on
sys.path, so run this as its own process rather than importing it next to other scapy users.
"""

import argparse
import importlib.util
import json
import os
import sys

try:
    import lbr_trex_client  # noqa: F401  (sets up the trex package paths: first, before trex)
    from trex.astf.api import ASTFProfile
    from trex.common.trex_exceptions import TRexError
    from trex.stl.api import STLProfile
except ImportError:
    sys.exit("compile_profile: the TRex client library is missing: "
             "install it with: .venv/bin/pip install -r requirements-dev.txt (lbr-trex-client)")


def profile_kind(path):
    """'astf' or 'stl', from what the module's register() object offers."""
    folder = os.path.dirname(os.path.abspath(path))
    sys.path.insert(0, folder)
    try:
        spec = importlib.util.spec_from_file_location("_probe_" + os.path.basename(path)[:-3], path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(folder)
    if not hasattr(module, "register"):
        raise SystemExit(f"compile_profile: {path}: no register() function; is this a TRex profile?")
    obj = module.register()
    if hasattr(obj, "get_profile"):
        return "astf"
    if hasattr(obj, "get_streams"):
        return "stl"
    raise SystemExit(f"compile_profile: {path}: register() object has neither get_profile() (ASTF) "
                     "nor get_streams() (STL)")


def compile_astf(path, tunables):
    profile = ASTFProfile.load_py(path, tunables=tunables)
    if profile is None:  # the profile's argparse stopped it: --help, or a bad tunable it reported
        raise SystemExit(2)
    return profile.to_json()


def compile_stl(path, tunables):
    directions = {}
    for direction in (0, 1):
        profile = STLProfile.load_py(path, direction=direction, port_id=direction, tunables=tunables)
        if profile is None:  # see compile_astf
            raise SystemExit(2)
        directions[str(direction)] = profile.to_json()
    return {"type": "stl", "directions": directions}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pairs", nargs="+", metavar="PROFILE.py OUT.json")
    parser.add_argument("-t", dest="tunables", action="append", default=[], metavar="KEY=VALUE",
                        help="profile tunable, passed as --KEY VALUE to its get_profile()/get_streams()")
    args = parser.parse_args(argv)
    if len(args.pairs) % 2:
        parser.error("give PROFILE.py OUT.json pairs: an output file is missing for " + args.pairs[-1])
    tunables = []
    for t in args.tunables:
        key, sep, value = t.partition("=")
        if not sep or not key:
            parser.error(f"tunable {t!r}: write it as KEY=VALUE, e.g. -t size=1k")
        tunables += ["--" + key, value]

    # Loading a profile imports it; keep the profile folder free of __pycache__.
    sys.dont_write_bytecode = True
    for src, out in zip(args.pairs[::2], args.pairs[1::2], strict=True):
        if not os.path.isfile(src):
            parser.error(f"profile {src} does not exist")
        src = os.path.abspath(src)
        try:
            data = compile_astf(src, tunables) if profile_kind(src) == "astf" else compile_stl(src, tunables)
        except TRexError as e:
            raise SystemExit(f"compile_profile: {src}: TRex refused the profile:{e}") from None
        tmp = out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, separators=(",", ":"))
        os.replace(tmp, out)


if __name__ == "__main__":
    main()
