#!/usr/bin/env python3
"""Prints the N slowest tests of a nextest JUnit report: python3 slowest.py JUNIT N."""
import sys
import xml.etree.ElementTree as ET

path, count = sys.argv[1], int(sys.argv[2])
cases = []
for case in ET.parse(path).getroot().iter("testcase"):
    cases.append((float(case.get("time", "0")), case.get("name", "?")))
cases.sort(reverse=True)
print(f"ci: the {min(count, len(cases))} slowest of {len(cases)} tests")
for seconds, name in cases[:count]:
    print(f"{seconds:8.1f} s  {name}")
