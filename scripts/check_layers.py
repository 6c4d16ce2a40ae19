#!/usr/bin/python3
"""The checks behind scripts/check_layers.sh: layer direction, detail/ boundaries, function length.

Run it through scripts/check_layers.sh, which holds the layer order, the limit and the exception
lists (this script reads the lists from that file, so that a violation of an exception's syntax
or a stale entry can name its line there). Standard library only.
"""

import argparse
import bisect
import fnmatch
import os
import re
import sys
import time

CXX_EXTS = ('.h', '.hh', '.hpp', '.inl', '.ipp', '.cpp', '.cc', '.cxx', '.c',
            '.h.in', '.hpp.in')  # .h.in: configured headers, such as version.h or an umbrella
CAPNP_EXTS = ('.capnp',)
# Folders that hold tests, benchmarks and examples: never library code.
NON_LIBRARY = ('tests', 'bench', 'fuzz', 'examples')
UMBRELLA = 'troupe/troupe.h'
ANYWHERE = ('troupe/version.h',)  # generated, depends on nothing: any file may include it


# ---------------------------------------------------------------------------------------------
# Lexing: blank comments, literals and preprocessor lines, keeping offsets and line breaks.

_SPECIAL = re.compile(r'["\'/#\n]')
_IDENT_CHAR = re.compile(r'[A-Za-z0-9_]')
_RAW_PREFIXES = ('R', 'u8R', 'uR', 'UR', 'LR')


def _blank(out, start, end):
    for k in range(start, end):
        if out[k] != '\n':
            out[k] = ' '


def clean_cxx(text, blank_literals=True, blank_preprocessor=True):
    """Returns text with comments (and optionally literals and # lines) turned into spaces."""
    out = list(text)
    n = len(text)
    i = 0
    while True:
        m = _SPECIAL.search(text, i)
        if not m:
            break
        i = m.start()
        c = text[i]
        if c == '\n':
            i += 1
        elif c == '#':
            # A directive only where the # is the line's first non-blank character.
            line_start = text.rfind('\n', 0, i) + 1
            if text[line_start:i].strip() or not blank_preprocessor:
                i += 1
                continue
            j = i
            while j < n:
                ch = text[j]
                if ch == '\n':
                    k = j - 1
                    if k >= 0 and text[k] == '\r':
                        k -= 1
                    if k >= 0 and text[k] == '\\':
                        j += 1
                        continue
                    break
                if text.startswith('/*', j):
                    end = text.find('*/', j + 2)
                    j = n if end < 0 else end + 2
                    continue
                if text.startswith('//', j):
                    end = text.find('\n', j)
                    j = n if end < 0 else end
                    continue
                if ch in '"\'':
                    # A quoted include or a literal in a #define; it cannot hold a line break.
                    end = j + 1
                    while end < n and text[end] != ch and text[end] != '\n':
                        end += 2 if text[end] == '\\' else 1
                    j = min(end + 1, n)
                    continue
                j += 1
            _blank(out, i, j)
            i = j
        elif c == '/':
            if text.startswith('//', i):
                end = text.find('\n', i)
                end = n if end < 0 else end
                _blank(out, i, end)
                i = end
            elif text.startswith('/*', i):
                end = text.find('*/', i + 2)
                end = n if end < 0 else end + 2
                _blank(out, i, end)
                i = end
            else:
                i += 1
        elif c == '"':
            start = i
            while start > 0 and _IDENT_CHAR.match(text[start - 1]):
                start -= 1
            prefix = text[start:i]
            if prefix in _RAW_PREFIXES:
                paren = text.find('(', i + 1)
                delim = text[i + 1:paren] if paren >= 0 else ''
                end = text.find(')' + delim + '"', paren + 1) if paren >= 0 else -1
                end = n if end < 0 else end + len(delim) + 2
            else:
                end = i + 1
                while end < n and text[end] != '"' and text[end] != '\n':
                    end += 2 if text[end] == '\\' else 1
                end = min(end + 1, n)
            if blank_literals:
                _blank(out, i, end)
            i = end
        else:  # '\''
            start = i
            while start > 0 and (_IDENT_CHAR.match(text[start - 1]) or text[start - 1] in ".'"):
                start -= 1
            if start < i and text[start].isdigit():
                i += 1  # a digit separator: 1'000'000
                continue
            end = i + 1
            while end < n and text[end] != '\'' and text[end] != '\n':
                end += 2 if text[end] == '\\' else 1
            end = min(end + 1, n)
            if blank_literals:
                _blank(out, i, end)
            i = end
    return ''.join(out)


class Lines:
    def __init__(self, text):
        self.starts = [0] + [m.end() for m in re.finditer('\n', text)]

    def of(self, offset):
        return bisect.bisect_right(self.starts, offset)


# ---------------------------------------------------------------------------------------------
# Finding function bodies.

_BRACE = re.compile(r'[{};]')
_BRACE_ONLY = re.compile(r'[{}]')
_ACCESS = re.compile(r'^\s*(?:(?:public|private|protected)\s*:(?!:)\s*)+')
_ATTRIBUTE = re.compile(r'\[\[.*?\]\]|\b__attribute__\s*\(\(.*?\)\)', re.S)
_OPERATOR = re.compile(r'\boperator\s*(\(\s*\)|\[\s*\]|->\*?|<=>|<<=|>>=|<<|>>|&&|\|\||\+\+|--|'
                       r'[-+*/%^&|~!=<>,]=?|new\b(\s*\[\s*\])?|delete\b(\s*\[\s*\])?)')
_QUALIFIER_TAIL = re.compile(r'\s*(?:\bconst|\bvolatile|\bnoexcept|\boverride|\bfinal|\bmutable|'
                             r'\bconstexpr|\btry|&&|&)\s*$')
_CLASS_KEY = re.compile(r'\b(class|struct|union)\b')
_NOT_NAMES = {'if', 'for', 'while', 'switch', 'catch', 'return', 'sizeof', 'decltype', 'alignof',
              'alignas', 'static_assert', 'noexcept', 'throw', 'new', 'delete', 'do', 'else',
              'try', 'requires', 'typeid', 'defined', 'using', 'typedef', 'case', 'default'}


def _match_brace(code, open_pos):
    depth = 0
    for m in _BRACE_ONLY.finditer(code, open_pos):
        depth += 1 if m.group() == '{' else -1
        if depth == 0:
            return m.start()
    return len(code) - 1


def _strip_template_headers(s):
    s = s.lstrip()
    while s.startswith('template'):
        rest = s[len('template'):].lstrip()
        if not rest.startswith('<'):
            break
        depth = 0
        for k, ch in enumerate(rest):
            if ch == '<':
                depth += 1
            elif ch == '>':
                depth -= 1
                if depth == 0:
                    s = rest[k + 1:].lstrip()
                    break
        else:
            break
    return s


def _depth_map(s):
    """Per character, the nesting depth in (), [] and {} (the depth before the character)."""
    depths = []
    depth = 0
    for ch in s:
        if ch in '([{':
            depths.append(depth)
            depth += 1
        elif ch in ')]}':
            depth -= 1
            depths.append(depth)
        else:
            depths.append(depth)
    return depths, depth


def _top_level_single(s, depths, ch):
    """Offsets of ch at depth 0 that are not part of a doubled or compound operator."""
    found = []
    for k, c in enumerate(s):
        if c != ch or depths[k] != 0:
            continue
        before = s[k - 1] if k > 0 else ''
        after = s[k + 1] if k + 1 < len(s) else ''
        if ch == ':' and (before == ':' or after == ':'):
            continue
        if ch == '=' and (after == '=' or before in '=!<>+-*/%^&|@'):
            continue
        found.append(k)
    return found


def _open_paren(text):
    """The index of the '(' that matches the ')' ending text (0 if unmatched)."""
    depth = 0
    for k in range(len(text) - 1, -1, -1):
        if text[k] == ')':
            depth += 1
        elif text[k] == '(':
            depth -= 1
            if depth == 0:
                return k
    return 0


def _strip_qualifiers(head):
    while True:
        head = head.rstrip()
        if head.endswith(')'):
            # noexcept(...) or throw(...)
            before = head[:_open_paren(head)].rstrip()
            if re.search(r'\b(noexcept|throw)$', before):
                head = before[:-len(re.search(r'\w+$', before).group())]
                continue
            return head
        m = _QUALIFIER_TAIL.search(head)
        if not m:
            return head
        head = head[:m.start()]


def _name_before(prefix):
    """The (qualified) name that prefix ends with, or None."""
    k = len(prefix)
    parts = []
    while True:
        while k > 0 and prefix[k - 1].isspace():
            k -= 1
        if k > 0 and prefix[k - 1] == '>':  # template arguments: f<T>(...) or A<T>::f
            depth = 0
            j = k - 1
            while j >= 0:
                if prefix[j] == '>':
                    depth += 1
                elif prefix[j] == '<':
                    depth -= 1
                    if depth == 0:
                        break
                elif prefix[j] in ';{}':
                    return None
                j -= 1
            if j < 0:
                return None
            k = j
            while k > 0 and prefix[k - 1].isspace():
                k -= 1
        end = k
        while k > 0 and (prefix[k - 1].isalnum() or prefix[k - 1] in '_@'):
            k -= 1
        ident = prefix[k:end]
        if not ident or ident[0].isdigit():
            return None
        j = k
        while j > 0 and prefix[j - 1].isspace():
            j -= 1
        if j > 0 and prefix[j - 1] == '~':
            ident = '~' + ident
            k = j - 1
        elif not ident.startswith('operator') and re.search(r'\boperator\s*$', prefix[:k]):
            # A conversion operator: operator bool, operator kj::StringPtr (last part only).
            k = prefix[:k].rstrip().rfind('operator')
            ident = 'operator ' + ident
        parts.append(ident)
        j = k
        while j > 0 and prefix[j - 1].isspace():
            j -= 1
        if prefix[j - 2:j] == '::' and j >= 2:
            k = j - 2
            continue
        break
    parts.reverse()
    return parts, k


def classify(stmt):
    """What a '{' preceded by stmt opens: ('namespace'|'linkage'|'class'|'function'|'other', name)."""
    s = _ATTRIBUTE.sub(lambda m: ' ' * len(m.group()), stmt)
    s = _ACCESS.sub('', s)
    s = _strip_template_headers(s).strip()
    if re.match(r'^(inline\s+)?namespace\b', s):
        return 'namespace', ''
    if re.match(r'^extern\s*$', s):  # extern "C" { (the literal is blanked)
        return 'linkage', ''
    if re.match(r'^(typedef\s+)?enum\b', s):
        return 'other', ''
    original = s
    s = _OPERATOR.sub(lambda m: 'operator' + '@' * (len(m.group()) - len('operator')), s)
    depths, final_depth = _depth_map(s)
    if final_depth != 0:
        return 'other', ''  # the brace is inside an expression's parentheses
    equals = _top_level_single(s, depths, '=')
    if equals:
        rhs = s[equals[0] + 1:].lstrip()
        if rhs.startswith('['):  # a lambda assigned to a variable: count it as a function
            named = _name_before(s[:equals[0]])
            return ('function', '::'.join(named[0])) if named else ('function', '<lambda>')
        return 'other', ''
    m = next((k for k in _CLASS_KEY.finditer(s) if depths[k.start()] == 0), None)
    rest = re.sub(r'\balignas\s*\([^()]*\)', ' ', s[m.end():]) if m else ''
    if m and '(' not in re.sub(r'<.*>', ' ', rest, flags=re.S):  # else: struct X* f(...)
        colons = _top_level_single(rest, _depth_map(rest)[0], ':')
        if colons:
            rest = rest[:colons[0]]
        rest = re.sub(r'<.*>', ' ', rest, flags=re.S)
        rest = re.sub(r'\balignas\s*\(.*?\)|\bfinal\b', ' ', rest, flags=re.S)
        rest = re.sub(r'\s*::\s*', '::', rest)
        names = re.findall(r'[A-Za-z_][\w:]*', rest)
        return 'class', (names[-1] if names else '')
    head = s
    colons = _top_level_single(s, depths, ':')
    for colon in colons:
        candidate = _strip_qualifiers(s[:colon])
        if candidate.endswith(')'):
            tail = s[colon + 1:].rstrip()
            if not (tail.endswith(')') or tail.endswith('}') or tail.endswith('...')):
                return 'other', ''
            head = s[:colon]
            break
    else:
        if colons:
            return 'other', ''
    arrow = re.search(r'->', head)
    while arrow and depths[arrow.start()] != 0:
        arrow = re.compile(r'->').search(head, arrow.end())
    if arrow:
        head = head[:arrow.start()]
    head = _strip_qualifiers(head)
    if not head.endswith(')'):
        if head.endswith(']'):
            return 'function', '<lambda>'
        return 'other', ''
    prefix = head[:_open_paren(head)]
    if prefix.rstrip().endswith(']'):
        return 'function', '<lambda>'
    named = _name_before(prefix)
    if not named:
        return 'other', ''
    parts, start = named
    if parts[-1] in _NOT_NAMES:
        return 'other', ''
    name = '::'.join(parts)
    # Give operators their real spelling back.
    if '@' in name:
        name = re.sub(r'\s+', '', original[start:len(prefix.rstrip())])
    return 'function', name


def find_functions(code):
    """Yields (name, name_offset, open_offset, close_offset) for each function body in code.

    code has comments, literals and preprocessor lines blanked. Namespace, class and linkage
    blocks are descended into; function bodies (lambdas and local classes included) are not.
    """
    scopes = []  # class names, or None for a namespace/linkage block
    seg_start = 0
    segments = []
    pos = 0
    n = len(code)
    while pos < n:
        m = _BRACE.search(code, pos)
        if not m:
            break
        p = m.start()
        ch = m.group()
        if ch == ';':
            segments, seg_start, pos = [], p + 1, p + 1
            continue
        if ch == '}':
            if scopes:
                scopes.pop()
            segments, seg_start, pos = [], p + 1, p + 1
            continue
        stmt = ''.join(segments) + code[seg_start:p]
        kind, name = classify(stmt)
        if kind in ('namespace', 'linkage'):
            scopes.append(None)
            segments, seg_start, pos = [], p + 1, p + 1
        elif kind == 'class':
            scopes.append(name)
            segments, seg_start, pos = [], p + 1, p + 1
        elif kind == 'function':
            close = _match_brace(code, p)
            classes = [c for c in scopes if c]
            full = '::'.join(classes + [name]) if name != '<lambda>' or not classes else name
            # Reported at the line of the function's name, the one people look for.
            name_offset = _name_offset(code, seg_start, p, name)
            yield full, name_offset, p, close
            segments, seg_start, pos = [], close + 1, close + 1
        else:
            close = _match_brace(code, p)
            segments.append(code[seg_start:p] + '{}')
            seg_start = pos = close + 1


def _name_offset(code, start, end, name):
    last = name.split('::')[-1].replace('operator', '').strip()
    if last and last != '<lambda>':
        k = code.rfind(last, start, end)
        if k >= 0:
            return k
    k = start
    while k < end and code[k].isspace():
        k += 1
    return k


# ---------------------------------------------------------------------------------------------
# Exception lists, read from check_layers.sh's data blocks.

def read_block(shell_text, block):
    """(line number, entry, reason) per entry of the ': <<'BLOCK'' here-document."""
    lines = shell_text.split('\n')
    entries = []
    inside = False
    for number, line in enumerate(lines, 1):
        if not inside:
            if re.match(r"^:\s*<<\s*'%s'\s*$" % re.escape(block), line):
                inside = True
            continue
        if line.strip() == block:
            return entries
        body, _, reason = line.partition('#')
        if body.strip():
            entries.append((number, body.strip(), reason.strip()))
    if not inside:
        raise SystemExit('check_layers: no %s block in the script' % block)
    raise SystemExit('check_layers: the %s block is not closed' % block)




# ---------------------------------------------------------------------------------------------
# The checks.

_INCLUDE = re.compile(r'^[ \t]*#[ \t]*(?:include|import|include_next)[ \t]*([<"])([^">\n]+)[">]',
                      re.M)
_CAPNP_IMPORT = re.compile(r'\bimport\s+"(/?troupe/[^"]+)"')


def walk(root):
    for top in sorted(os.listdir(root)):
        path = os.path.join(root, top)
        if top.startswith('.') or top.startswith('build') or not os.path.isdir(path):
            continue
        for folder, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith('.') and d not in (
                '__pycache__', 'node_modules') and not d.startswith('build'))
            for name in sorted(files):
                if name.endswith(CXX_EXTS) or name.endswith(CAPNP_EXTS):
                    full = os.path.join(folder, name)
                    yield os.path.relpath(full, root).replace(os.sep, '/'), full


class Checker:
    def __init__(self, args):
        self.args = args
        self.rank = {}
        for level, peers in enumerate(args.layers.split()):
            for layer in peers.split(','):
                self.rank[layer] = level
        self.top_rank = max(self.rank.values())
        self.library = set(args.library.split())
        self.violations = []  # (path, line, message)
        self.notes = []
        self.functions = []  # (length, path, line, name)
        self.include_count = 0
        self.file_count = 0
        self.allow_used = set()
        self.exception_used = {}
        self._read_config()

    def _read_config(self):
        with open(self.args.config, encoding='utf-8') as f:
            text = f.read()
        name = os.path.relpath(self.args.config, self.args.root)
        self.config_name = os.path.abspath(self.args.config) if name.startswith('..') else name
        self.allow_rules = []
        for line, entry, reason in read_block(text, 'DETAIL_INCLUDE_ALLOWLIST'):
            fields = entry.split()
            if len(fields) != 2 or not fields[1].startswith('troupe/') or (
                    '/detail/' not in fields[1]):
                self.violation(self.config_name, line, 'allowlist entry must read '
                               '"FILE-OR-GLOB  troupe/LAYER/detail/HEADER  # reason"')
                continue
            if not reason:
                self.violation(self.config_name, line, 'allowlist entry needs a "# reason"')
            self.allow_rules.append((line, fields[0], fields[1]))
        self.exception_rules = {}
        for line, entry, reason in read_block(text, 'FUNCTION_LENGTH_EXCEPTIONS'):
            path, sep, name = entry.partition('::')
            if not sep or not name or ' ' in entry:
                self.violation(self.config_name, line, 'exception entry must read '
                               '"PATH::Function::Name  # reason"')
                continue
            if not reason:
                self.violation(self.config_name, line, 'exception entry needs a "# reason"')
            self.exception_rules[(path, name)] = line

    def violation(self, path, line, message):
        self.violations.append((path, line, message))

    def check_file(self, rel, full):
        self.file_count += 1
        try:
            with open(full, encoding='utf-8', errors='replace') as f:
                text = f.read()
        except OSError as e:
            self.violation(rel, 0, 'cannot read: %s' % e)
            return
        lines = Lines(text)
        if rel.endswith(CAPNP_EXTS):
            stripped = re.sub(r'#[^\n]*', lambda m: ' ' * len(m.group()), text)
            includes = [(m.start(), '<', m.group(1).lstrip('/'))
                        for m in _CAPNP_IMPORT.finditer(stripped)]
        else:
            stripped = clean_cxx(text, blank_literals=False, blank_preprocessor=False)
            includes = [(m.start(), m.group(1), m.group(2).strip())
                        for m in _INCLUDE.finditer(stripped)]
        for offset, quote, target in includes:
            self.check_include(rel, lines.of(offset), quote, target)
        if rel.split('/')[0] in self.library and rel.endswith(CXX_EXTS) and (
                not rel.endswith('.in')):
            self.check_functions(rel, text, lines)

    def check_include(self, rel, line, quote, target):
        parts = rel.split('/')
        top = parts[0]
        own = self.rank.get(top)  # None: not a layer (tests, bench, fuzz, examples, cmake...)
        tparts = target.split('/')
        if tparts[0] != 'troupe' or len(tparts) < 2:
            if quote == '"' and len(tparts) >= 2:
                self.check_source_path_include(rel, line, top, own, target, tparts[0])
            return  # otherwise a system or third-party header, or a file beside this one
        self.include_count += 1
        if len(tparts) == 2:  # troupe/<header>: version.h, the umbrella
            if target in ANYWHERE:
                return
            if target == UMBRELLA:
                if own is not None and own < self.top_rank:
                    self.violation(rel, line, '%s/ must not include the umbrella header %s: '
                                   'include the headers it needs' % (top, target))
                return
            self.violation(rel, line, 'includes %s, which is no header the layer check knows '
                           '(add it to scripts/check_layers.py)' % target)
            return
        layer = tparts[1]
        if layer not in self.rank:
            self.violation(rel, line, 'includes %s, but %s/ is no layer: add it to LAYERS in '
                           'scripts/check_layers.sh' % (target, layer))
            return
        if own is not None and self._above(layer, top):
            self.violation(rel, line, '%s/ must not include %s: %s' % (
                top, target, self._direction(top, layer)))
        if len(tparts) > 3 and tparts[2] == 'detail':
            tested = parts[1] if top == 'tests' and len(parts) > 2 else None
            if top == layer or tested == layer:
                return
            key = target
            allowed = False
            for rule_line, rule_file, rule_header in self.allow_rules:
                if rule_header == key and fnmatch.fnmatchcase(rel, rule_file):
                    self.allow_used.add(rule_line)
                    allowed = True
            if not allowed:
                self.violation(rel, line, 'includes %s, internal to %s/ (use a public header of '
                               '%s/, or allowlist it in DETAIL_INCLUDE_ALLOWLIST in '
                               'scripts/check_layers.sh)' % (target, layer, layer))

    def check_source_path_include(self, rel, line, top, own, target, first):
        """A quoted include by source path: "tools/...", "python/...", "tests/..."."""
        if first in NON_LIBRARY and own is not None:
            self.violation(rel, line, 'library code (%s/) includes "%s", which is test, '
                           'benchmark or example code' % (top, target))
        elif first == 'detail' or (first in self.rank and self.rank[first] < self.top_rank):
            self.violation(rel, line, 'include "%s" as "troupe/%s": troupe code is included by '
                           'its installed path' % (target, target))
        elif first in self.rank and own is not None and self._above(first, top):
            # tools/... or python/...: the top layers, included by their source path.
            self.violation(rel, line, '%s/ must not include "%s": %s' % (
                top, target, self._direction(top, first)))

    def _above(self, layer, own_layer):
        """Whether code in own_layer/ must not include layer/."""
        if self.rank[layer] > self.rank[own_layer]:
            return True
        return layer != own_layer and self.rank[layer] == self.rank[own_layer] == self.top_rank

    def _direction(self, source, target):
        if self.rank[source] == self.rank[target] == self.top_rank:
            return '%s/ and %s/ are both top layers, independent of each other' % (
                source, target)
        return '%s/ is above %s/ (see LAYERS in scripts/check_layers.sh)' % (target, source)

    def check_functions(self, rel, text, lines):
        limit = self.args.max_lines
        for name, name_offset, open_offset, close_offset in find_functions(clean_cxx(text)):
            length = lines.of(close_offset) - lines.of(open_offset) + 1
            line = lines.of(name_offset)
            self.functions.append((length, rel, line, name))
            key = (rel, name)
            if key in self.exception_rules:
                self.exception_used[key] = max(self.exception_used.get(key, 0), length)
            elif length > limit:
                self.violation(rel, line, '%s is %d lines long, over the limit of %d (split it, '
                               'or add "%s::%s  # reason" to FUNCTION_LENGTH_EXCEPTIONS in '
                               'scripts/check_layers.sh)' % (name, length, limit, rel, name))

    def stale_entries(self):
        for line, _, _ in self.allow_rules:
            if line not in self.allow_used:
                self.notes.append((self.config_name, line, 'note: this allowlist entry matches '
                                   'no include; remove it?'))
        for (path, name), line in self.exception_rules.items():
            used = self.exception_used.get((path, name))
            if used is None:
                self.notes.append((self.config_name, line, 'note: this exception matches no '
                                   'function; remove it?'))
            elif used <= self.args.max_lines:
                self.notes.append((self.config_name, line, 'note: %s is %d line(s) now, within '
                                   'the limit: remove its exception' % (name, used)))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument('--root', default='.')
    ap.add_argument('--config', required=True, help='check_layers.sh, which holds the lists')
    ap.add_argument('--layers', required=True,
                    help='bottom to top, space-separated; peers joined with commas')
    ap.add_argument('--library', required=True, help='folders whose functions are measured')
    ap.add_argument('--max-lines', type=int, required=True)
    ap.add_argument('--longest', type=int, default=0,
                    help='also list the N longest functions (to check the function finder)')
    args = ap.parse_args()
    started = time.monotonic()

    checker = Checker(args)
    for rel, full in walk(args.root):
        checker.check_file(rel, full)
    checker.stale_entries()

    if args.longest:
        print('The %d longest functions (lines from the opening brace to the closing one):'
              % args.longest)
        for length, rel, line, name in sorted(checker.functions,
                                              key=lambda f: (-f[0], f[1], f[2]))[:args.longest]:
            print('  %4d  %s:%d: %s' % (length, rel, line, name))
    for path, line, message in sorted(checker.notes):
        print('%s:%d: %s' % (path, line, message))
    violations = checker.violations
    if violations:
        for path, line, message in sorted(violations):
            print('%s:%d: %s' % (path, line, message))
        sys.stdout.flush()
        print('check_layers: %d violation%s (rules and exceptions: scripts/check_layers.sh)' % (
            len(violations), '' if len(violations) == 1 else 's'), file=sys.stderr)
        return 1
    over = sum(1 for f in checker.functions if f[0] > args.max_lines)
    print('check_layers: OK: %d files, %d includes of troupe code, %d functions (%d over %d '
          'lines, all excepted) in %.1fs' % (
              checker.file_count, checker.include_count, len(checker.functions), over,
              args.max_lines, time.monotonic() - started))
    return 0


if __name__ == '__main__':
    sys.exit(main())
