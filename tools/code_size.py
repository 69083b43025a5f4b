#!/usr/bin/env python3
"""Reports C++ files and functions that are too long to read in one sitting.

Usage: code_size.py [--max-file-lines N] [--max-function-lines N]
                    [--exceptions FILE] [--list] FILE...

A function's length is counted from the line of its body's opening brace to
the line of the closing one. The parser is deliberately small: it strips
comments and literals, then tracks braces and classifies each opening brace
at namespace or class scope by the text before it. Exits 1 when a file or
function is over its limit, printing one line per offender. An exceptions
file lists "path" or "path name" per line, each with its reason after " -- ";
an exception that is no longer needed is an error too, so the list stays true.
"""
import argparse
import re
import sys

_RAW = re.compile(r'R"([^(\s]{0,16})\(')


def strip(text):
    """Replaces comments and string/char literals with spaces, keeping lines."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '/' and text.startswith('//', i):
            j = text.find('\n', i)
            j = n if j < 0 else j
            out.append(' ' * (j - i))
            i = j
        elif c == '/' and text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r'[^\n]', ' ', text[i:j]))
            i = j
        elif c == 'R' and _RAW.match(text, i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == '_')):
            m = _RAW.match(text, i)
            end = ')' + m.group(1) + '"'
            j = text.find(end, m.end())
            j = n if j < 0 else j + len(end)
            out.append('""' + re.sub(r'[^\n]', ' ', text[i + 2:j]))
            i = j
        elif c in '"\'':
            if c == "'" and i > 0 and text[i - 1].isalnum():  # digit separator 1'000
                out.append(' ')
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != '\n':
                j += 2 if text[j] == '\\' else 1
            j = min(j + 1, n)
            out.append(c + ' ' * (j - i - 2) + c if j - i >= 2 else text[i:j])
            i = j
        elif c == '#' and (i == 0 or text[i - 1] == '\n'):
            j = i
            while True:  # a preprocessor line, with continuations
                k = text.find('\n', j)
                k = n if k < 0 else k
                if k > 0 and text[k - 1] == '\\':
                    j = k + 1
                    continue
                break
            out.append(re.sub(r'[^\n]', ' ', text[i:k]))
            i = k
        else:
            out.append(c)
            i += 1
    return ''.join(out)


_SCOPE = re.compile(r'\b(namespace|extern\s+""|class|struct|union|enum)\b')


def functions(text):
    """Yields (name, first_line, last_line) of every function body."""
    code = strip(text)
    stack = []  # kinds of the open braces
    head_start = 0
    line = 1
    starts = []
    for i, c in enumerate(code):
        if c == '\n':
            line += 1
        elif c in ';':
            if 'function' not in stack:
                head_start = i + 1
        elif c == '{':
            if 'function' in stack or 'other' in stack:
                stack.append('block')
                continue
            head = code[head_start:i]
            flat = ' '.join(head.split())
            scope = _SCOPE.search(flat)
            paren = flat.find('(')
            if scope and (paren < 0 or scope.start() < paren):  # namespace, class, struct, enum
                kind = 'scope'
            elif ')' in flat and not flat.rstrip().endswith('='):
                kind = 'function'
            else:
                kind = 'other'
            if kind == 'function':
                m = re.search(r'([~\w:]+(?:<[^()]*>)?)\s*$', flat[:paren]) if paren >= 0 else None
                starts.append((m.group(1) if m else '?', line))
            stack.append(kind)
            head_start = i + 1
        elif c == '}':
            kind = stack.pop() if stack else 'scope'
            if kind == 'function':
                name, first = starts.pop()
                yield name, first, line
            if 'function' not in stack:
                head_start = i + 1
    return


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--max-file-lines', type=int, default=600)
    parser.add_argument('--max-function-lines', type=int, default=80)
    parser.add_argument('--list', action='store_true', help='print every function with its length')
    parser.add_argument('--exceptions', help='file of allowed offenders, "path [name] -- reason" per line')
    parser.add_argument('files', nargs='*')
    args = parser.parse_args()
    allowed = {}
    if args.exceptions:
        with open(args.exceptions) as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line or line.startswith('#'):
                    continue
                key, sep, reason = line.partition(' -- ')
                if not sep or not reason.strip():
                    print(f'{args.exceptions}:{n}: an exception needs its reason after " -- "')
                    return 1
                allowed[tuple(key.split())] = False
    over = 0

    def offend(key, message):
        nonlocal over
        if key in allowed:
            allowed[key] = True
        else:
            print(message)
            over += 1

    for path in args.files:
        with open(path, encoding='utf-8', errors='replace') as f:
            text = f.read()
        lines = text.count('\n')
        if lines > args.max_file_lines:
            offend((path,), f'{path}: {lines} lines (limit {args.max_file_lines})')
        for name, first, last in functions(text):
            length = last - first + 1
            if args.list:
                print(f'{length}\t{path}:{first}\t{name}')
            elif length > args.max_function_lines:
                offend((path, name), f'{path}:{first}: {name} is {length} lines (limit {args.max_function_lines})')
    for key, used in allowed.items():
        if not used and not args.list:
            print(f'{args.exceptions}: "{" ".join(key)}" is within its limit now; remove the exception')
            over += 1
    return 1 if over else 0


if __name__ == '__main__':
    sys.exit(main())
