#!/usr/bin/env python3
"""Counts Catch2 test cases from a Bazel build-event JSON file.

Prints failing targets, then one line "tests: N passed, M failed[, K skipped]".
A test target that failed to build, crashed or timed out without a Catch2
summary counts as one failed case. A target tagged flaky counts by its last
attempt, and one that passed only on a retry is named on a RETRIED line.
With --fuzz FILE (deploy/fuzz.sh --results), each fuzz harness counts as
one case too, and with --checks FILE each structure check of deploy/test.sh
(layering, code size). Exit status 1 if anything failed.

    test_summary.py EVENTS.json [--fuzz RESULTS.txt]
"""
import json
import re
import sys
from urllib.parse import unquote, urlparse

ALL_PASSED = re.compile(r"All tests passed \((\d+) assertions? in (\d+) test cases?\)")
MIXED = re.compile(r"test cases:\s+(\d+)\s+\|\s+(\d+) passed\s+\|\s+(\d+) failed")
ALL_FAILED = re.compile(r"test cases:\s+(\d+)\s+\|\s+(\d+) failed")
NONE_RAN = re.compile(r"^No tests ran$", re.M)
SKIPPED = re.compile(r"^skipped: (\d+) \[gpu\] test cases", re.M)


def count_log(text):
    """(passed, failed, skipped) of one Catch2 run, or None without a summary."""
    skipped = sum(int(m) for m in SKIPPED.findall(text))
    m = ALL_PASSED.search(text)
    if m:
        return int(m.group(2)), 0, skipped
    m = MIXED.search(text)
    if m:
        return int(m.group(2)), int(m.group(3)), skipped
    m = ALL_FAILED.search(text)
    if m:
        return 0, int(m.group(2)), skipped
    if skipped and NONE_RAN.search(text):
        return 0, 0, skipped  # every case of the binary needs a GPU
    return None


def count_results(path, kind):
    """(passed, failed, failure lines) from a results file of one
    "<name> passed|failed <detail>" line per case: deploy/fuzz.sh's harnesses
    (kind "fuzz") or deploy/test.sh's structure checks (kind "check")."""
    passed = failed = 0
    failures = []
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return 0, 0, []
    for line in lines:
        name, _, rest = line.partition(" ")
        status, _, detail = rest.partition(" ")
        if status == "passed":
            passed += 1
        elif name:
            failed += 1
            failures.append(f"{kind} {name}: {detail}")
    return passed, failed, failures


def main(path, fuzz_path=None, checks_path=None):
    results = {}  # label -> (status, log path, attempt): the last attempt of a target tagged flaky
    build_failed = set()
    tests_seen = set()
    with open(path) as f:
        for line in f:
            ev = json.loads(line)
            eid = ev.get("id", {})
            if "testResult" in eid:
                label = eid["testResult"]["label"]
                tr = ev.get("testResult", {})
                log = None
                for out in tr.get("testActionOutput", []):
                    if out.get("name") == "test.log":
                        log = unquote(urlparse(out["uri"]).path)
                attempt = eid["testResult"].get("attempt", 1)
                if label not in results or attempt >= results[label][2]:
                    results[label] = (tr.get("status", "NO_STATUS"), log, attempt)
            elif "targetCompleted" in eid:
                label = eid["targetCompleted"]["label"]
                completed = ev.get("completed", {})
                if completed.get("testSize") or label.endswith("_test"):
                    tests_seen.add(label)
                if "aborted" in ev or not completed.get("success", False):
                    skipped_incompatible = ev.get("aborted", {}).get("reason") == "SKIPPED"
                    if not skipped_incompatible and ("aborted" in ev or completed):
                        build_failed.add(label)

    passed = failed = skipped = 0
    failures = []
    for label in sorted(build_failed):
        if label in results:
            continue
        if label.endswith("_test") or label in tests_seen:
            failed += 1
            failures.append(f"{label}: failed to build")
    retried = []
    for label, (status, log, attempt) in sorted(results.items()):
        if attempt > 1 and status == "PASSED":
            retried.append(f"{label} (passed on attempt {attempt})")
        text = ""
        if log:
            try:
                with open(log, errors="replace") as f:
                    text = f.read()
            except OSError:
                pass
        counts = count_log(text)
        if counts is None:
            failed += 1
            failures.append(f"{label}: {status} without a Catch2 summary")
            continue
        p, fl, s = counts
        if status != "PASSED" and fl == 0:
            fl = 1  # e.g. a crash after the summary, or a sanitizer report
            failures.append(f"{label}: {status}")
        elif fl:
            failures.append(f"{label}: {fl} failed test case(s) (log: {log})")
        passed += p
        failed += fl
        skipped += s

    for extra, kind in ((fuzz_path, "fuzz"), (checks_path, "check")):
        if extra:
            p, fl, lines = count_results(extra, kind)
            passed += p
            failed += fl
            failures.extend(lines)

    for line in retried:
        print("RETRIED " + line)
    for line in failures:
        print("FAILED " + line)
    tail = f", {skipped} skipped" if skipped else ""
    print(f"tests: {passed} passed, {failed} failed{tail}")
    return 1 if failed or (passed == 0 and not results) else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    files = {}
    for flag in ("--fuzz", "--checks"):
        if flag in args:
            i = args.index(flag)
            files[flag] = args[i + 1] if i + 1 < len(args) else None
            del args[i:i + 2]
    if len(args) != 1:
        sys.exit("usage: test_summary.py EVENTS.json [--fuzz RESULTS.txt] [--checks RESULTS.txt]")
    sys.exit(main(args[0], files.get("--fuzz"), files.get("--checks")))
