"""``python -m pycollective.timeline summary|merge PATH``: read a trace without a viewer."""

import argparse
import json
import sys

from . import _summary, _writer, discard


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m pycollective.timeline",
                                     description=__doc__.split(":")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    summary = sub.add_parser("summary", help="per collective and algorithm: calls, time per "
                             "call, late arrivals and the share of each phase")
    summary.add_argument("path")
    summary.add_argument("--json", action="store_true", help="the rows as JSON")
    summary.add_argument("--skip", type=int, default=0, metavar="N", help="leave out the "
                         "first N calls on each communicator (setup, compiling kernels)")
    summary.add_argument("--plot", metavar="PNG", help="draw each rank's time per phase "
                         "(needs matplotlib: the 'plot' extra)")
    merge = sub.add_parser("merge", help="join the PATH.rankN.json parts ranks wrote when a "
                           "job ended with an exception into PATH")
    merge.add_argument("path")
    args = parser.parse_args(argv)
    # PYCOLLECTIVE_TIMELINE set for the job may have started a recording in this
    # process too: its file at exit would overwrite the trace read here.
    discard()
    if args.command == "merge":
        ranks = _writer.merge(args.path)
        print(f"{args.path}: ranks {ranks}")
        return 0
    doc = _summary.load(args.path)
    if args.json:
        json.dump(_summary.summarize(doc, args.skip), sys.stdout, indent=1)
        print()
    else:
        print("\n".join(_summary.table(doc, args.skip)))
    if args.plot:
        _summary.plot(doc, args.plot, args.skip)
    return 0


if __name__ == "__main__":
    sys.exit(main())
