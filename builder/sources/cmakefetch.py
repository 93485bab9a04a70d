"""Native build inputs of a component: the `FetchContent_Declare` calls its CMake build makes, found at
the pinned commit (read from the git tree, no checkout).

Read: the root CMakeLists.txt and every `.cmake` file it include()s (recursively, by path or by module
name found in a CMAKE_MODULE_PATH folder of the repository). Not read: add_subdirectory(), function
and macro bodies, builtin modules. Variables set by plain set()/option() in those files are resolved.

A small, honest evaluator decides if()/elseif()/else() and return(): conditions it understands are
decided (constants, variables, NOT/AND/OR, parentheses, DEFINED, STREQUAL, EQUAL, MATCHES, IN_LIST,
VERSION_*); anything else is "not decided", and a declaration under it is kept with that condition
written down (`when`). The target device (e.g. `VLLM_TARGET_DEVICE=cpu`) and the build's environment
are inputs, so `if(VLLM_TARGET_DEVICE STREQUAL "cpu") ... return() endif()` picks the CPU inputs.

How the build hands a source to CMake: the project's own variable when a `FetchContent_Declare(<name>
SOURCE_DIR ${VAR})` exists and VAR comes from `$ENV{...}` (vLLM: VLLM_CUTLASS_SRC_DIR), else CMake's
`FETCHCONTENT_SOURCE_DIR_<NAME>`.
"""
from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import pygit2

from builder.core.errors import BadInput

ROOT = "@SRC@"  # CMAKE_SOURCE_DIR and friends: the repository root
MAX_INCLUDES = 200
UNSET = "\0unset"  # a possible value: "not defined"
TRUE = {"1", "ON", "YES", "TRUE", "Y"}
FALSE = {"0", "OFF", "NO", "FALSE", "N", "IGNORE", "NOTFOUND", ""}
BINARY = {"STREQUAL", "STRLESS", "STRGREATER", "EQUAL", "LESS", "GREATER", "LESS_EQUAL", "GREATER_EQUAL",
          "MATCHES", "IN_LIST", "VERSION_EQUAL", "VERSION_LESS", "VERSION_GREATER", "VERSION_LESS_EQUAL",
          "VERSION_GREATER_EQUAL", "STRLESS_EQUAL", "STRGREATER_EQUAL", "PATH_EQUAL"}
UNARY_UNKNOWN = {"EXISTS", "COMMAND", "POLICY", "TARGET", "TEST", "IS_DIRECTORY", "IS_SYMLINK", "IS_ABSOLUTE",
                 "IS_READABLE", "IS_WRITABLE", "IS_EXECUTABLE"}
DECLARE_KEYS = {"GIT_REPOSITORY", "GIT_TAG", "URL", "URL_HASH", "SOURCE_DIR", "SOURCE_SUBDIR", "BINARY_DIR",
                "GIT_SHALLOW", "GIT_PROGRESS", "GIT_SUBMODULES", "GIT_REMOTE_UPDATE_STRATEGY", "GIT_CONFIG",
                "UPDATE_DISCONNECTED", "PATCH_COMMAND", "DOWNLOAD_EXTRACT_TIMESTAMP", "EXCLUDE_FROM_ALL",
                "SYSTEM", "OVERRIDE_FIND_PACKAGE", "FIND_PACKAGE_ARGS", "URL_MD5", "DOWNLOAD_NAME",
                "GIT_SUBMODULES_RECURSE", "UPDATE_COMMAND", "CONFIGURE_COMMAND", "BUILD_COMMAND",
                "INSTALL_COMMAND", "TEST_COMMAND", "TLS_VERIFY", "QUIET", "SUBBUILD_DIR"}


@dataclass
class Declaration:
    """One FetchContent_Declare that fetches (GIT_REPOSITORY + GIT_TAG, or URL)."""
    name: str            # as written (FetchContent lower-cases it for its own variables)
    git_repository: str  # as written, variables resolved ('' for URL inputs)
    git_tag: str         # tag, branch or commit, variables resolved
    url: str = ""        # URL archive inputs (not supported by the lock; named)
    file: str = ""       # where it is declared, e.g. cmake/cpu_extension.cmake:123
    when: list[str] = field(default_factory=list)  # conditions not decided statically, as written
    src_dir_env: str = ""  # the project's own override (env var), if it has one
    direct: bool = False   # FetchContent_Populate(<name> GIT_REPOSITORY ...): ignores FETCHCONTENT_SOURCE_DIR_<NAME>

    @property
    def key(self) -> str:
        return self.name.lower()

    @property
    def receive(self) -> str:
        """How the build hands the source to CMake."""
        return self.src_dir_env or f"FETCHCONTENT_SOURCE_DIR_{self.name.upper()}"


@dataclass
class Discovery:
    declarations: list[Declaration]
    files: list[str]  # the CMake files read, in order
    cmake: bool       # the repository has a root CMakeLists.txt


# --------------------------------------------------------------------------- lexer

TOKEN = re.compile(r"""
    (?P<bracket_comment>\#\[(?P<bc_eq>=*)\[.*?\](?P=bc_eq)\])
  | (?P<comment>\#[^\n]*)
  | (?P<bracket>\[(?P<b_eq>=*)\[.*?\](?P=b_eq)\])
  | (?P<quoted>"(?:[^"\\]|\\.)*")
  | (?P<open>\()
  | (?P<close>\))
  | (?P<space>[ \t\r\n]+)
  | (?P<unquoted>(?:[^\s()#"\\]|\\.)(?:[^\s()"\\]|\\.|"(?:[^"\\]|\\.)*")*)
""", re.S | re.X)


@dataclass
class Arg:
    text: str
    quoted: bool  # quoted or bracket: never split on ';', never taken as a variable name in if()


@dataclass
class Command:
    name: str  # lower-cased
    args: list[Arg]
    line: int


def parse(text: str, where: str) -> list[Command]:
    """CMake language commands `name(args)`; nested parentheses become '(' ')' arguments."""
    commands: list[Command] = []
    pos, line = 0, 1
    name: str | None = None
    depth = 0
    args: list[Arg] = []
    start = 1
    while pos < len(text):
        match = TOKEN.match(text, pos)
        if match is None:
            raise BadInput(f"{where}:{line}: cannot read CMake text near {text[pos:pos + 20]!r}")
        kind, value = match.lastgroup, match.group(0)
        if kind in ("bc_eq", "b_eq"):
            kind = "bracket_comment" if value.startswith("#") else "bracket"
        pos = match.end()
        if name is None:
            if kind == "unquoted" and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
                rest = re.compile(r"[ \t]*\(").match(text, pos)
                if rest is None:
                    raise BadInput(f"{where}:{line}: expected '(' after {value}")
                name, depth, args, start, pos = value.lower(), 1, [], line, rest.end()
            elif kind not in ("space", "comment", "bracket_comment"):
                raise BadInput(f"{where}:{line}: expected a command, got {value[:20]!r}")
        elif kind == "open":
            depth += 1
            args.append(Arg("(", False))
        elif kind == "close":
            depth -= 1
            if depth == 0:
                commands.append(Command(name, args, start))
                name = None
            else:
                args.append(Arg(")", False))
        elif kind == "quoted":
            args.append(Arg(_unescape(value[1:-1]), True))
        elif kind == "bracket":
            eq = value.index("[", 1) - 1
            args.append(Arg(value[eq + 2:len(value) - eq - 2].removeprefix("\n"), True))
        elif kind == "unquoted":
            args.append(Arg(_unescape(value), False))
        line += value.count("\n")
    if name is not None:
        raise BadInput(f"{where}:{start}: unterminated {name}(")
    return commands


def _unescape(text: str) -> str:
    return re.sub(r"\\([^A-Za-z0-9;])|\\n|\\t", lambda m: m.group(1) or {"\\n": "\n", "\\t": "\t"}[m.group(0)], text)


# --------------------------------------------------------------------------- variables

Reader = Callable[[str], "str | None"]
Values = frozenset[str] | None  # the possible values of a variable; None: anything (not known statically)


class Scope:
    """Variables as sets of possible values; a variable never set here is not known (it may come from
    find_package, a cache entry or the command line) unless the caller said what it is."""

    def __init__(self, known: dict[str, str], env: dict[str, str]):
        self.vars: dict[str, Values] = {k: frozenset([v]) for k, v in known.items()}
        self.env = env
        for name in ("CMAKE_SOURCE_DIR", "PROJECT_SOURCE_DIR", "CMAKE_CURRENT_SOURCE_DIR"):
            self.vars[name] = frozenset([ROOT])

    def get(self, name: str) -> Values:
        return self.vars.get(name)

    def one(self, name: str) -> str | None:
        values = self.get(name)
        if values is None or len(values) != 1:
            return None
        value = next(iter(values))
        return None if value == UNSET else value

    def set(self, name: str, value: str | None) -> None:
        self.vars[name] = None if value is None else frozenset([value])

    def merge(self, states: list[dict[str, Values]]) -> None:
        """After code that may or may not have run: each variable may hold any value it has in one of
        the possible end states (a variable missing from one of them is not known)."""
        merged: dict[str, Values] = {}
        for name in set().union(*states):
            values = [state.get(name) for state in states]
            merged[name] = None if any(v is None for v in values) else frozenset().union(*values)  # type: ignore[arg-type]
        self.vars = merged

    def expand(self, text: str) -> str | None:
        """${VAR} and $ENV{VAR} references (innermost first); None when a value is not known."""
        for _ in range(50):
            match = re.search(r"\$(ENV)?\{([^${}]*)\}", text)
            if match is None:
                return text
            if match.group(1):
                value: str | None = self.env.get(match.group(2), "")
            else:
                values = self.get(match.group(2))
                value = self.one(match.group(2)) if values is not None else None
                if values is not None and values == frozenset([UNSET]):
                    value = ""
            if value is None:
                return None
            text = text[:match.start()] + value + text[match.end():]
        return None


def _words(scope: Scope, args: list[Arg]) -> list[str] | None:
    """Arguments after expansion, unquoted ones split on ';' (None when one is not known)."""
    out: list[str] = []
    for arg in args:
        value = scope.expand(arg.text)
        if value is None:
            return None
        if arg.quoted:
            out.append(value)
        else:
            out.extend(v for v in value.split(";") if v != "")
    return out


# --------------------------------------------------------------------------- conditions

Truth = bool | None  # None: not decided statically


def _truthy(value: str) -> Truth:
    upper = value.upper()
    if upper in TRUE or re.fullmatch(r"-?[0-9.]+", value) and value.strip("0.-") != "":
        return True
    if upper in FALSE or upper.endswith("-NOTFOUND") or re.fullmatch(r"-?[0-9.]+", value):
        return False
    return None


class Condition:
    """if() arguments evaluated as CMake does (policy CMP0054 NEW: quoted arguments are never variables)."""

    def __init__(self, scope: Scope, args: list[Arg]):
        self.scope = scope
        self.args = args
        self.pos = 0

    def evaluate(self) -> Truth:
        try:
            result = self._or()
        except (IndexError, ValueError):
            return None
        return result if self.pos == len(self.args) else None

    def _peek(self) -> str | None:
        if self.pos < len(self.args) and not self.args[self.pos].quoted:
            return self.args[self.pos].text
        return None

    def _or(self) -> Truth:
        left = self._and()
        while self._peek() == "OR":
            self.pos += 1
            right = self._and()
            left = True if left is True or right is True else (None if None in (left, right) else False)
        return left

    def _and(self) -> Truth:
        left = self._not()
        while self._peek() == "AND":
            self.pos += 1
            right = self._not()
            left = False if left is False or right is False else (None if None in (left, right) else True)
        return left

    def _not(self) -> Truth:
        if self._peek() == "NOT":
            self.pos += 1
            inner = self._not()
            return None if inner is None else not inner
        return self._primary()

    def _primary(self) -> Truth:
        word = self._peek()
        if word == "(":
            self.pos += 1
            inner = self._or()
            if self._peek() != ")":
                raise ValueError("unbalanced")
            self.pos += 1
            return inner
        if word == "DEFINED":
            self.pos += 1
            name = self.args[self.pos].text
            self.pos += 1
            env = re.fullmatch(r"ENV\{(.*)\}", name)
            if env:
                return env.group(1) in self.scope.env
            values = self.scope.get(name)
            if values is None:
                return None
            return False if values == frozenset([UNSET]) else (None if UNSET in values else True)
        if word in UNARY_UNKNOWN:
            self.pos += 2
            return None
        left = self.args[self.pos]
        self.pos += 1
        op = self._peek()
        if op in BINARY:
            self.pos += 1
            right = self.args[self.pos]
            self.pos += 1
            return self._binary(left, op, right)
        return self._single(left)

    def _values(self, arg: Arg, deref: bool = True) -> Values:
        """Possible values of an operand: an unquoted name of a variable is that variable."""
        text = self.scope.expand(arg.text)
        if text is None:
            return None
        if deref and not arg.quoted and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_./+-]*", text):
            values = self.scope.get(text)
            if text in self.scope.vars:
                return None if values is None else frozenset("" if v == UNSET else v for v in values)
        return frozenset([text])

    def _single(self, arg: Arg) -> Truth:
        text = self.scope.expand(arg.text)
        if text is None:
            return None
        constant = _truthy(text)
        if constant is not None or arg.quoted:
            return bool(constant) if arg.quoted else constant
        values = self.scope.get(text)
        if values is None:
            return None  # a variable this evaluator does not know (find_package, cache, command line)
        results = {False if v == UNSET else _truthy(v) is not False for v in values}
        return results.pop() if len(results) == 1 else None

    def _binary(self, left: Arg, op: str, right: Arg) -> Truth:
        lefts = self._values(left)
        if op == "IN_LIST":  # the right side names a list variable
            lists = self.scope.get(self.scope.expand(right.text) or "")
            if lefts is None or lists is None:
                return None
            found = {lv in v.split(";") for lv in lefts for v in lists}
            return found.pop() if len(found) == 1 else None
        rights = self._values(right)
        if lefts is None or rights is None:
            return None
        results = {_compare(a, op, b) for a in lefts for b in rights}
        return results.pop() if len(results) == 1 else None


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("."):
        digits = re.match(r"[0-9]*", piece)
        parts.append(int(digits.group(0)) if digits and digits.group(0) else 0)
    return tuple(parts)


def _compare(a: str, op: str, b: str) -> Truth:
    if op == "STREQUAL":
        return a == b
    if op == "PATH_EQUAL":
        return posixpath.normpath(a) == posixpath.normpath(b)
    if op == "MATCHES":
        try:
            return re.search(b, a) is not None
        except re.error:
            return None
    if op.startswith("STR"):
        cmp = (a > b) - (a < b)
    elif op.startswith("VERSION_"):
        va, vb = _version(a), _version(b)
        size = max(len(va), len(vb))
        va, vb = va + (0,) * (size - len(va)), vb + (0,) * (size - len(vb))
        cmp = (va > vb) - (va < vb)
    else:
        try:
            fa, fb = float(a), float(b)
        except ValueError:
            return False
        cmp = (fa > fb) - (fa < fb)
    kind = op.removeprefix("STR").removeprefix("VERSION_")
    return {"EQUAL": cmp == 0, "LESS": cmp < 0, "GREATER": cmp > 0, "LESS_EQUAL": cmp <= 0,
            "GREATER_EQUAL": cmp >= 0}[kind]


def _written(args: list[Arg]) -> str:
    text = " ".join(f'"{a.text}"' if a.quoted else a.text for a in args)
    return text.replace("( ", "(").replace(" )", ")")


# --------------------------------------------------------------------------- the walk


class Walker:
    def __init__(self, read: Reader, known: dict[str, str], env: dict[str, str]):
        self.read = read
        self.scope = Scope(known, env)
        self.declarations: list[Declaration] = []
        self.overrides: dict[str, str] = {}   # declared name (lower) -> VAR of `SOURCE_DIR ${VAR}`
        self.source_dirs: dict[str, list[str]] = {}  # name (lower) -> VARs of `set(<name>_SOURCE_DIR ${VAR})`
        self.from_env: dict[str, str] = {}    # VAR -> ENV name, from set(VAR $ENV{NAME})
        self.files: list[str] = []

    def file(self, path: str, when: list[str]) -> None:
        if len(self.files) >= MAX_INCLUDES:
            raise BadInput(f"{path}: more than {MAX_INCLUDES} CMake files included")
        text = self.read(path)
        if text is None:
            return
        self.files.append(path)
        saved = self.scope.vars.get("CMAKE_CURRENT_LIST_DIR")
        self.scope.vars["CMAKE_CURRENT_LIST_DIR"] = frozenset([_join(ROOT, posixpath.dirname(path))])
        self.scope.vars["CMAKE_CURRENT_LIST_FILE"] = frozenset([_join(ROOT, path)])
        commands = parse(text, path)
        self._overrides(commands)
        self.block(commands, 0, path, list(when))
        if saved is not None:
            self.scope.vars["CMAKE_CURRENT_LIST_DIR"] = saved

    def _overrides(self, commands: list[Command]) -> None:
        """Read in every branch (taken or not): `FetchContent_Declare(<name> SOURCE_DIR ${VAR})` and
        `set(VAR $ENV{NAME})`, the project's own way to hand a source in."""
        for cmd in commands:
            texts = [a.text for a in cmd.args]
            if cmd.name == "fetchcontent_declare" and len(texts) >= 3 and texts[1] == "SOURCE_DIR" \
                    and "GIT_REPOSITORY" not in texts and "URL" not in texts:
                ref = re.fullmatch(r"\$\{([A-Za-z0-9_]+)\}", texts[2])
                if ref:
                    self.overrides[texts[0].lower()] = ref.group(1)
            elif cmd.name == "set" and (len(texts) == 2 or len(texts) > 2 and texts[2] == "CACHE"):
                env = re.fullmatch(r"\$ENV\{([A-Za-z0-9_]+)\}", texts[1])
                source = re.fullmatch(r"([A-Za-z0-9_]+)_SOURCE_DIR", texts[0])
                ref = re.fullmatch(r"\$\{([A-Za-z0-9_]+)\}", texts[1])
                if source and ref:  # `set(<name>_SOURCE_DIR "${VAR}")`: a local tree instead of a direct Populate
                    self.source_dirs.setdefault(source.group(1).lower(), []).append(ref.group(1))
                if env:
                    self.from_env[texts[0]] = env.group(1)
                    if env.group(1) not in self.scope.env:  # a plain build: the override is not given
                        self.scope.vars.setdefault(texts[0], frozenset([UNSET]))

    def block(self, commands: list[Command], start: int, path: str, when: list[str], end: int | None = None) -> str:
        """Run commands[start:end]; how it ended: "end", or after a return() that certainly ("yes") or
        possibly ("maybe") ran."""
        i = start
        stop = len(commands) if end is None else end
        maybe = False
        while i < stop:
            cmd = commands[i]
            if cmd.name == "if":
                i, returned = self._if(commands, i, path, when)
                if returned == "yes":
                    return "yes"
                if returned == "maybe" and not maybe:
                    maybe, when = True, when + ["after a return() that may run"]
                continue
            if cmd.name in ("function", "macro"):
                i = _skip(commands, i, cmd.name, "end" + cmd.name, path) + 1
                continue
            if cmd.name in ("foreach", "while"):
                close = _skip(commands, i, cmd.name, "end" + cmd.name, path)
                before = dict(self.scope.vars)
                if self.block(commands, i + 1, path, when + [f"{cmd.name}({_written(cmd.args)})"], close) != "end" \
                        and not maybe:
                    maybe, when = True, when + ["after a return() that may run"]
                self.scope.merge([before, dict(self.scope.vars)])
                i = close + 1
                continue
            if cmd.name == "return":
                return "maybe" if when else "yes"
            self.command(cmd, path, when)
            i += 1
        return "maybe" if maybe else "end"

    def _if(self, commands: list[Command], i: int, path: str, when: list[str]) -> tuple[int, str]:
        """if/elseif/else/endif starting at i: (index after endif, "end" | "yes" | "maybe" as block())."""
        branches: list[tuple[Command, int]] = [(commands[i], i)]
        depth, j = 0, i + 1
        while j < len(commands):
            name = commands[j].name
            if name == "if":
                depth += 1
            elif name == "endif":
                if depth == 0:
                    break
                depth -= 1
            elif name in ("elseif", "else") and depth == 0:
                branches.append((commands[j], j))
            j += 1
        else:
            raise BadInput(f"{path}:{commands[i].line}: if() without endif()")
        ends = [at for _, at in branches[1:]] + [j]
        negated: list[str] = []
        outcome = "end"
        before = dict(self.scope.vars)
        ends_states: list[dict[str, Values]] = []
        for (cmd, at), hi in zip(branches, ends):
            truth: Truth = True if cmd.name == "else" else Condition(self.scope, cmd.args).evaluate()
            written = f"({_written(cmd.args)})"
            if truth is False:
                continue
            if truth is True and not negated:  # certainly taken: the other branches never run
                return j + 1, self.block(commands, at + 1, path, when, hi)
            extra = [] if cmd.name == "else" else [written[1:-1]]
            self.scope.vars = dict(before)
            returned = self.block(commands, at + 1, path, when + negated + extra, hi)
            ends_states.append(dict(self.scope.vars))
            if returned != "end":
                outcome = "maybe"
            if truth is True:
                break
            negated.append(f"NOT {written}")
        else:
            ends_states.append(before)  # no branch certainly taken: maybe none ran
        self.scope.vars = before
        if ends_states:
            self.scope.merge(ends_states)
        return j + 1, outcome

    def command(self, cmd: Command, path: str, when: list[str]) -> None:
        if cmd.name == "set" and cmd.args:
            name = self.scope.expand(cmd.args[0].text)
            if name is None or name.startswith("ENV{"):
                return
            rest = cmd.args[1:]
            words = [a.text for a in rest if not a.quoted]
            if "PARENT_SCOPE" in words:
                return
            if "CACHE" in words:
                at = next(k for k, a in enumerate(rest) if not a.quoted and a.text == "CACHE")
                force = "FORCE" in words
                if name in self.scope.vars and not force:
                    return  # a cache entry never replaces a normal variable
                rest = rest[:at]
            values = _words(self.scope, rest)
            self.scope.set(name, None if values is None else ";".join(values))
        elif cmd.name == "unset" and cmd.args:
            self.scope.set(cmd.args[0].text, UNSET)
        elif cmd.name == "option" and len(cmd.args) >= 2:
            if cmd.args[0].text not in self.scope.vars:
                value = self.scope.expand(cmd.args[2].text) if len(cmd.args) > 2 else "OFF"
                self.scope.set(cmd.args[0].text, value)
        elif cmd.name == "list" and len(cmd.args) >= 3 and cmd.args[0].text == "APPEND":
            name = cmd.args[1].text
            values = _words(self.scope, cmd.args[2:])
            old = self.scope.one(name) if name in self.scope.vars else ""
            if values is None or old is None:
                self.scope.set(name, None)
            else:
                self.scope.set(name, ";".join([v for v in [old] if v] + values))
        elif cmd.name == "include" and cmd.args:
            self._include(cmd, path, when)
        elif cmd.name in ("fetchcontent_declare", "fetchcontent_populate") and len(cmd.args) > 1:
            self._declare(cmd, path, when)

    def _include(self, cmd: Command, path: str, when: list[str]) -> None:
        target = self.scope.expand(cmd.args[0].text)
        if target is None:
            raise BadInput(f"{path}:{cmd.line}: include({cmd.args[0].text}): the path is not known statically")
        if target.endswith(".cmake") or "/" in target:
            rel = _relative(target)
            if rel is None:
                return  # outside the repository (a system file)
            self.file(rel, when)
            return
        for folder in (self.scope.one("CMAKE_MODULE_PATH") or "").split(";"):
            rel = _relative(_join(folder, f"{target}.cmake")) if folder else None
            if rel is not None and self.read(rel) is not None:
                self.file(rel, when)
                return
        # a builtin module (FetchContent, CheckCXXCompilerFlag, ...): nothing to read

    def _declare(self, cmd: Command, path: str, when: list[str]) -> None:
        name = self.scope.expand(cmd.args[0].text)
        if name is None:
            raise BadInput(f"{path}:{cmd.line}: FetchContent_Declare({cmd.args[0].text}): the name is not known statically")
        fields: dict[str, list[Arg]] = {}
        key = ""
        for arg in cmd.args[1:]:
            if not arg.quoted and arg.text in DECLARE_KEYS:
                key = arg.text
                fields.setdefault(key, [])
            elif key:
                fields[key].append(arg)
        where = f"{path}:{cmd.line}"
        if "SOURCE_DIR" in fields and "GIT_REPOSITORY" not in fields and "URL" not in fields:
            return  # the project's own override (read by _overrides)

        def value(k: str) -> str:
            words = _words(self.scope, fields.get(k, []))
            if words is None:
                raise BadInput(f"{where}: FetchContent_Declare({name} {k} {_written(fields[k])}): not known statically")
            return ";".join(words)

        if "GIT_REPOSITORY" in fields:
            decl = Declaration(name, value("GIT_REPOSITORY"), value("GIT_TAG") or "", file=where, when=list(when),
                               direct=cmd.name == "fetchcontent_populate")
        elif "URL" in fields:
            decl = Declaration(name, "", "", url=value("URL"), file=where, when=list(when))
        elif cmd.name == "fetchcontent_populate":
            return  # populates a declared one (by name)
        else:
            raise BadInput(f"{where}: FetchContent_Declare({name}): expected GIT_REPOSITORY or URL")
        self.declarations.append(decl)

    def result(self) -> list[Declaration]:
        """One declaration per name (FetchContent: the first one wins), each with its own override."""
        seen: dict[str, Declaration] = {}
        for decl in self.declarations:
            if decl.key in seen:
                first = seen[decl.key]
                if not first.when:
                    continue
                if not decl.when:  # the certain one wins over a conditional one
                    seen[decl.key] = decl
                    continue
                if (first.git_repository, first.git_tag, first.url) != (decl.git_repository, decl.git_tag, decl.url):
                    raise BadInput(f"{decl.file}: FetchContent_Declare({decl.name}): a second, different declaration"
                                   f" (first at {first.file}) under conditions not decided statically")
                continue
            seen[decl.key] = decl
        for decl in seen.values():
            var = self.overrides.get(decl.key) or next(
                (v for v in self.source_dirs.get(decl.key, []) if v in self.from_env), None)
            if var:
                decl.src_dir_env = self.from_env.get(var, "")
        return sorted(seen.values(), key=lambda d: d.key)


def _skip(commands: list[Command], i: int, opener: str, closer: str, path: str) -> int:
    depth = 0
    for j in range(i + 1, len(commands)):
        if commands[j].name == opener:
            depth += 1
        elif commands[j].name == closer:
            if depth == 0:
                return j
            depth -= 1
    raise BadInput(f"{path}:{commands[i].line}: {opener}() without {closer}()")


def _join(a: str, b: str) -> str:
    return posixpath.normpath(posixpath.join(a, b)) if b else a


def _relative(path: str) -> str | None:
    """A path below the repository root, or None."""
    if path.startswith(ROOT):
        rel = posixpath.normpath(path[len(ROOT):].lstrip("/"))
    elif path.startswith("/"):
        return None
    else:
        rel = posixpath.normpath(path)
    return None if rel.startswith("..") or rel == "." else rel


# --------------------------------------------------------------------------- from git

def tree_reader(repo: pygit2.Repository, commit: str) -> Reader:
    """path -> text of that file at commit (None when absent), straight from the object database."""
    tree = repo[commit].peel(pygit2.Commit).tree

    def read(path: str) -> str | None:
        try:
            entry = tree[path]
        except KeyError:
            return None
        obj = repo[entry.id]
        if not isinstance(obj, pygit2.Blob):
            return None
        data: bytes = obj.data
        return data.decode("utf-8", errors="replace")

    return read


def discover(read: Reader, known: dict[str, str] | None = None, env: dict[str, str] | None = None) -> Discovery:
    """The FetchContent declarations a build would make, given the CMake variables the build passes
    (`known`, e.g. the target device) and its environment."""
    if read("CMakeLists.txt") is None:
        return Discovery([], [], False)
    walker = Walker(read, dict(known or {}), dict(env or {}))
    walker.file("CMakeLists.txt", [])
    return Discovery(walker.result(), walker.files, True)


def discover_at(repo: pygit2.Repository, commit: str, known: dict[str, str] | None = None,
                env: dict[str, str] | None = None) -> Discovery:
    return discover(tree_reader(repo, commit), known, env)

