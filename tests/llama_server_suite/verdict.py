"""Read the suite's JUnit report: print `N passed, N failed`, and fail on a failure the
expected-failures list does not name (a pattern per line, `*` matching any text, then
two spaces, `#` and its reason).

usage: verdict.py REPORT.xml EXPECTED.txt [RERUN.xml] [--unlisted FILE]
A rerun's outcomes (the unlisted failures run once more: the suite's own timeouts make a
few of its tests fail on a loaded machine) replace the first run's. --unlisted writes the
unlisted failures' pytest ids to FILE.
"""
import argparse
import fnmatch
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def outcomes(report: Path) -> dict[str, str]:
    """'file.py::test[param]' -> passed, failed or skipped."""
    result = {}
    for case in ET.parse(report).iter("testcase"):
        name = f"{case.get('classname', '').split('.')[-1]}.py::{case.get('name')}"
        kinds = {child.tag for child in case}
        result[name] = ("failed" if kinds & {"failure", "error"} else
                        "skipped" if "skipped" in kinds else "passed")
    return result


def expected(path: Path) -> list[str]:
    """Each line's pattern (its first word; `*` any text, brackets as they are)."""
    lines = (line.split("  #", 1)[0].strip() for line in path.read_text().splitlines())
    words = [line.split()[0] for line in lines if line and not line.startswith("#")]
    return [w.replace("[", "\0").replace("]", "[]]").replace("\0", "[[]") for w in words]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("report", type=Path)
    p.add_argument("expected", type=Path)
    p.add_argument("rerun", type=Path, nargs="?")
    p.add_argument("--unlisted", type=Path)
    a = p.parse_args()
    got, patterns = outcomes(a.report), expected(a.expected)
    if a.rerun and a.rerun.exists():
        got.update(outcomes(a.rerun))
    listed = {n for n in got if any(fnmatch.fnmatchcase(n, p) for p in patterns)}
    failed = sorted(n for n, o in got.items() if o == "failed")
    surprises = [n for n in failed if n not in listed]
    now_pass = sorted(n for n in listed if got[n] == "passed")
    counts = {o: sum(v == o for v in got.values()) for o in ("passed", "failed", "skipped")}
    print(f"llama.cpp server suite against lead: {counts['passed']} passed, "
          f"{counts['failed']} failed ({len(failed) - len(surprises)} of them listed in "
          f"{a.expected.name}), {counts['skipped']} skipped")
    for name in now_pass:
        print(f"  listed as failing but passed: {name}")
    for name in surprises:
        print(f"  FAILED, not listed: {name}")
    if a.unlisted:
        a.unlisted.write_text("".join(f"unit/{n}\n" for n in surprises))
    sys.exit(1 if surprises else 0)


if __name__ == "__main__":
    main()
