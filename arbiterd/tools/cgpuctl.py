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

from arbiterd.tools.adminclient import AdminClient, add_admin_args, run_tool


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cgpuctl", description="Read and write arbiterd's settings tree, as "
                                "'cat' and 'echo VALUE >' do with /proc/cgpu_km on cGPU hosts.\n\n" + __doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_admin_args(p)
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

    def body() -> int:
        client = AdminClient.from_env(args.admin, args.token_file)
        if args.cmd in ("ls", "cat"):
            sys.stdout.write(client.get(args.path))
        elif args.cmd == "echo":
            client.put(args.path, args.value)
        elif args.cmd == "status":
            print(json.dumps(client.status(), indent=2))
        return 0

    return run_tool("cgpuctl", body)


if __name__ == "__main__":
    sys.exit(main())
