"""``cgpuctl``: echo-style administration of arbiterd, as with /proc/cgpu_km.

    cgpuctl ls [PATH]          list a folder of the settings tree
    cgpuctl cat PATH           print a file
    cgpuctl echo VALUE PATH    write a file (as: echo VALUE > /proc/cgpu_km/PATH)
    cgpuctl status             the daemon's JSON status document

Exit codes: 0 success, 1 the daemon refused (its reason printed), 2 usage
error, 3 the daemon is unreachable.
"""

from __future__ import annotations

import argparse
import json
import sys

from arbiterd.tools.adminclient import AdminClient, Refused, Unreachable


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cgpuctl", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--admin", metavar="ADDR",
                   help="admin.sock path or http://127.0.0.1:PORT (default $CGPU_ADMIN or /run/cgpu/admin.sock)")
    p.add_argument("--token-file", metavar="FILE",
                   help="bearer token for the TCP admin listener (default $CGPU_ADMIN_TOKEN_FILE)")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    ls = sub.add_parser("ls", help="list a folder (default the root)")
    ls.add_argument("path", nargs="?", default="")
    cat = sub.add_parser("cat", help="print a file")
    cat.add_argument("path")
    echo = sub.add_parser("echo", help="write VALUE to PATH")
    echo.add_argument("value")
    echo.add_argument("path")
    sub.add_parser("status", help="print the JSON status document")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        client = AdminClient.from_env(args.admin, args.token_file)
        if args.cmd in ("ls", "cat"):
            sys.stdout.write(client.get(args.path))
        elif args.cmd == "echo":
            client.put(args.path, args.value)
        elif args.cmd == "status":
            print(json.dumps(client.status(), indent=2))
    except Refused as exc:
        print(f"cgpuctl: {exc}", file=sys.stderr)
        return 1
    except Unreachable as exc:
        print(f"cgpuctl: {exc}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
