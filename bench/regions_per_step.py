#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Parallel regions per training step on two threads, with their call sites (README "Fewer parallel
regions per step (issue 11)"). Runs `cgrad bench` under the region_count.so preload (bench/preload)
with --steps 1 and --steps 3 and prints half the difference, per function.
usage: bench/regions_per_step.py BUILD_DIR CONFIG [CONFIG...]"""
import collections, os, re, subprocess, sys


def run(cgrad, so, config, steps):
    env = dict(os.environ, OMP_WAIT_POLICY='passive', LD_PRELOAD=so)
    err = subprocess.run(['nice', '-n', '19', cgrad, 'bench', '--config', config, '--threads', '2', '--steps', str(steps),
                          '--warmup', '1'], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True).stderr
    blocks = []  # one per process (bench forks a child for the sgemm reference and one per config)
    for line in err.splitlines():
        m = re.match(r'region_count: (\d+) multi', line)
        if m:
            blocks.append([int(m.group(1)), collections.Counter()])
            continue
        m = re.match(r'region_count:\s+(\d+)\s+\S+\+(0x[0-9a-f]+)', line)
        if m and blocks:
            blocks[-1][1][m.group(2)] += int(m.group(1))
    return max(blocks, key=lambda b: b[0])  # the training child


def main():
    build, configs = sys.argv[1], sys.argv[2:]
    cgrad, so = os.path.join(build, 'cgrad'), os.path.abspath(os.path.join(build, 'region_count.so'))
    for config in configs:
        a, b = run(cgrad, so, config, 1), run(cgrad, so, config, 3)
        print(f'{config}: {(b[0] - a[0]) / 2:g} two-thread regions per step')
        per = collections.Counter()
        for site, n in b[1].items():
            name = subprocess.run(['addr2line', '-f', '-e', cgrad, hex(int(site, 16) - 1)], capture_output=True,
                                  text=True).stdout.split('\n')[0]
            per[name] += (n - a[1].get(site, 0)) / 2
        for name, n in per.most_common():
            if n > 0:
                print(f'  {n:6g}  {name}')


if __name__ == '__main__':
    main()
