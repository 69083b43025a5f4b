#!/usr/bin/env python3
"""Checks that the build's dependencies point only down the declared layers.

The layers are declared once, in bazel/layers.bzl. This script asks Bazel for
every rule's direct dependencies and fails (exit 1, one line per offence) on:
  - a package that belongs to no layer;
  - a library or binary that depends on a layer its own layer may not use
    (pointing up, or sideways between siblings such as planner and runtime);
  - packages of one layer that depend on each other in a cycle.
Tests and testonly libraries are exempt from the second rule: they are leaves.

  check_layers.py              check the workspace (runs bazel query)
  check_layers.py --self-test  also plant an upward edge and a cycle into the
                               real graph and require both to be caught
"""
import argparse
import collections
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_layers(path=os.path.join(ROOT, 'bazel', 'layers.bzl')):
    scope = {}
    with open(path) as f:
        exec(compile(f.read(), path, 'exec'), scope)  # Starlark data is Python
    return scope['LAYERS']


def package_of(label):
    return label.split(':', 1)[0] if ':' in label else label


class Layers:
    def __init__(self, layers):
        self.layers = layers
        self.by_name = {l['name']: l for l in layers}
        self.order = [l['name'] for l in layers]

    def layer_of(self, package):
        best, best_len = None, -1
        for layer in self.layers:
            for p in layer['packages']:
                if p.endswith('/...'):
                    base = p[:-len('/...')]
                    hit = package == base or package.startswith(base + '/')
                else:
                    hit = package == p
                if hit and len(p) > best_len:
                    best, best_len = layer['name'], len(p)
        return best

    def may_use(self, user, used):
        return user == used or used in self.by_name[user]['uses']


def query_graph():
    """Returns (edges, exempt): direct rule->label edges and the test/testonly rules."""
    def run(expr, output):
        out = subprocess.run(['bazel', 'query', '--noshow_progress', '--output=' + output, expr],
                             cwd=ROOT, check=True, capture_output=True, text=True).stdout
        return out
    rules = 'kind("rule", //...) except kind("package_group", //...)'
    edges = []
    for line in run('deps(%s, 1)' % rules, 'graph').splitlines():
        if '->' not in line:
            continue
        src, dst = line.split('->')
        src = src.strip().strip('"')
        for d in dst.strip().strip('"').split('\\n'):
            if d.startswith('//'):
                for s in src.split('\\n'):
                    edges.append((s, d))
    exempt = set(run('kind(".*_test", //...) + attr(testonly, 1, //...)', 'label').split())
    return edges, exempt


def workspace():
    """(layers, edges, exempt) of this workspace: the declaration and the build graph."""
    return (Layers(load_layers()),) + query_graph()


def check(layers, edges, exempt):
    problems = []
    packages = set()
    for src, dst in edges:
        packages.add(package_of(src))
        packages.add(package_of(dst))
    for p in sorted(packages):
        if layers.layer_of(p) is None:
            problems.append(f'{p}: in no layer; add it to bazel/layers.bzl')
    pkg_edges = collections.defaultdict(set)
    seen = set()
    for src, dst in edges:
        sp, dp = package_of(src), package_of(dst)
        if sp == dp or src in exempt:
            continue
        sl, dl = layers.layer_of(sp), layers.layer_of(dp)
        if sl is None or dl is None:
            continue
        if not layers.may_use(sl, dl):
            direction = 'up' if layers.order.index(dl) > layers.order.index(sl) else 'sideways'
            key = (src, dst)
            if key not in seen:
                seen.add(key)
                problems.append(f'{src} depends on {dst}: layer {sl} may not use layer {dl} (points {direction})')
        elif sl == dl:
            pkg_edges[sp].add(dp)
    problems += [f'package cycle in one layer: {" -> ".join(c)}' for c in cycles(pkg_edges)]
    return problems


def cycles(graph):
    """One representative cycle per strongly connected component of >1 node."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp) + [sorted(comp)[0]])

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def self_test(layers, edges, exempt):
    """Plants one upward dependency and one cycle; both must be reported."""
    libs = [s for s, _ in edges if package_of(s) == '//src/common' and s not in exempt]
    apps = [d for _, d in edges if package_of(d) == '//cli']
    assert libs and apps, 'self-test needs //src/common and //cli targets'
    planted = (libs[0], apps[0])
    got = check(layers, edges + [planted], exempt)
    if not any(g.startswith(f'{planted[0]} depends on {planted[1]}') for g in got):
        return [f'self-test: the planted upward edge {planted[0]} -> {planted[1]} was not caught']
    a = [s for s, _ in edges if package_of(s) == '//planner/sim' and s not in exempt]
    b = [s for s, _ in edges if package_of(s) == '//planner/plan' and s not in exempt]
    got = check(layers, edges + [(a[0], b[0])], exempt)
    if not any(g.startswith('package cycle') and '//planner/sim' in g for g in got):
        return [f'self-test: the planted cycle {a[0]} -> {b[0]} was not caught']
    return []


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--self-test', action='store_true')
    args = parser.parse_args()
    layers, edges, exempt = workspace()
    problems = check(layers, edges, exempt)
    if args.self_test:
        problems += self_test(layers, edges, exempt)
    for p in problems:
        print(p)
    if problems:
        print(f'check_layers: {len(problems)} problem(s); the layers are declared in bazel/layers.bzl')
        return 1
    print(f'check_layers: {len(edges)} edges, {len(layers.layers)} layers: every dependency points down'
          + (' (self-test: a planted upward edge and a planted cycle were caught)' if args.self_test else ''))
    return 0


if __name__ == '__main__':
    sys.exit(main())
