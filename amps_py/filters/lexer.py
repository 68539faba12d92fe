"""Filter text to tokens.

The lexer is context-sensitive in one place: a ``/`` where a value is expected starts a
field path (``/a/b``), while a ``/`` after a value is the division operator. So
``/a / /b`` divides two fields, ``10/2`` divides two numbers, and ``/a/2`` is the field
``2`` inside ``a`` (FIX tags are numeric). Write division with spaces around it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .errors import FilterError


class Tok(enum.Enum):
    """Token kinds."""

    NUMBER = "number"
    STRING = "string"
    PATH = "field path"
    WORD = "word"
    OP = "operator"
    LPAREN = "'('"
    RPAREN = "')'"
    COMMA = "','"
    EOF = "end of filter"


@dataclass(frozen=True, slots=True)
class PathStep:
    """One step of a field path: a key to look up, or an array subscript."""

    key: str | None  # None for a subscript
    index: int = 0


@dataclass(frozen=True, slots=True)
class Token:
    """A lexed token.

    ``value`` is the decoded literal for NUMBER/STRING, the steps for PATH, the
    upper-cased word for WORD, and the operator text for OP.
    """

    kind: Tok
    pos: int
    text: str
    value: object = None


KEYWORDS = frozenset(
    {
        "AND",
        "OR",
        "NOT",
        "BETWEEN",
        "IN",
        "LIKE",
        "BEGINS",
        "ENDS",
        "WITH",
        "IS",
        "NULL",
        "NAN",
        "TRUE",
        "FALSE",
        "MOD",
    }
)

# Words after which a '/' means division rather than the start of a path.
_VALUE_WORDS = frozenset({"NULL", "TRUE", "FALSE", "NAN"})

_TWO_CHAR_OPS = frozenset({"==", "!=", "<>", "<=", ">="})
_ONE_CHAR_OPS = frozenset("=<>+-*/%")

_SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r"}
_OCTAL = frozenset("01234567")
_HEX = frozenset("0123456789abcdefABCDEF")
_DIGITS = frozenset("0123456789")

# Integer literals above this become floats (AMPS integers are at most unsigned 64-bit).
_MAX_INT_LITERAL = 2**64 - 1


def _is_name_start(ch: str) -> bool:
    return ch.isalnum() or ch in "_@"


def _is_name_char(ch: str) -> bool:
    return ch.isalnum() or ch in "_@-.:"


def _is_word_start(ch: str) -> bool:
    return ch.isalpha() or ch == "_"


def _is_word_char(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


class _Lexer:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.tokens: list[Token] = []

    def error(self, problem: str, pos: int, hint: str = "") -> FilterError:
        return FilterError(problem, text=self.text, position=pos, hint=hint)

    def value_expected(self) -> bool:
        if not self.tokens:
            return True
        last = self.tokens[-1]
        if last.kind in (Tok.NUMBER, Tok.STRING, Tok.PATH, Tok.RPAREN):
            return False
        return not (last.kind is Tok.WORD and last.value in _VALUE_WORDS)

    def run(self) -> list[Token]:
        text = self.text
        n = len(text)
        while True:
            while self.pos < n and text[self.pos].isspace():
                self.pos += 1
            if self.pos >= n:
                self.tokens.append(Token(Tok.EOF, n, ""))
                return self.tokens
            self.tokens.append(self.next_token())

    def next_token(self) -> Token:
        text = self.text
        start = self.pos
        ch = text[start]
        nxt = text[start + 1] if start + 1 < len(text) else ""
        if ch == "/" and self.value_expected():
            return self.path()
        if ch == "[" and self.value_expected():
            return self.bracketed_path()
        if ch in "'\"":
            return self.string(start, raw=False)
        if ch in "rR" and nxt in ("'", '"'):
            self.pos += 1
            return self.string(start, raw=True)
        if ch in _DIGITS or (ch == "." and nxt in _DIGITS):
            return self.number()
        if _is_word_start(ch):
            end = start + 1
            while end < len(text) and _is_word_char(text[end]):
                end += 1
            self.pos = end
            word = text[start:end]
            return Token(Tok.WORD, start, word, word.upper())
        if ch == "(":
            self.pos += 1
            return Token(Tok.LPAREN, start, ch)
        if ch == ")":
            self.pos += 1
            return Token(Tok.RPAREN, start, ch)
        if ch == ",":
            self.pos += 1
            return Token(Tok.COMMA, start, ch)
        pair = ch + nxt
        if pair in _TWO_CHAR_OPS:
            self.pos += 2
            return Token(Tok.OP, start, pair, pair)
        if pair == "&&" or ch == "&":
            shown = pair if pair == "&&" else ch
            raise self.error(f"unexpected {shown!r}", start, "use AND, not &&")
        if pair == "||" or ch == "|":
            shown = pair if pair == "||" else ch
            raise self.error(
                f"unexpected {shown!r}",
                start,
                "use OR, not || (to join strings use CONCAT(a, b))",
            )
        if ch == "!":
            raise self.error("unexpected '!'", start, "use NOT for negation and != for 'not equal'")
        if ch in _ONE_CHAR_OPS:
            self.pos += 1
            return Token(Tok.OP, start, ch, ch)
        if ch == "[":
            raise self.error(
                "unexpected '['",
                start,
                "subscripts go right after a field name with no space, e.g. /items[0]",
            )
        raise self.error(
            f"unexpected character {ch!r}",
            start,
            "fields start with '/', strings need quotes, and operators are "
            "= != < > <= >= + - * / % AND OR NOT",
        )

    def path(self) -> Token:
        text = self.text
        start = self.pos
        steps: list[PathStep] = []
        while True:
            # self.pos is at a '/'
            seg_start = self.pos + 1
            end = seg_start
            if end < len(text) and _is_name_start(text[end]):
                end += 1
                while end < len(text) and _is_name_char(text[end]):
                    end += 1
            if end == seg_start:
                raise self.error(
                    "expected a field name after '/'",
                    seg_start,
                    "write fields as /name/child; to divide, put the '/' between two values "
                    "with spaces, e.g. /a / 2; for names with odd characters use [/odd name]",
                )
            steps.append(PathStep(text[seg_start:end]))
            self.pos = end
            self.subscripts(steps)
            if (
                self.pos + 1 < len(text)
                and text[self.pos] == "/"
                and _is_name_start(text[self.pos + 1])
            ):
                continue
            break
        self.no_trailing_slash()
        return Token(Tok.PATH, start, text[start : self.pos], tuple(steps))

    def no_trailing_slash(self, bracketed: bool = False) -> None:
        """Reject a '/' glued to the end of a path: '/a/', '/a//b', '/a/ 2'."""
        text = self.text
        if self.pos < len(text) and text[self.pos] == "/":
            if text.startswith("//", self.pos):
                raise self.error(
                    "'//' is not supported in field paths",
                    self.pos,
                    "write every step of the path, e.g. /order/items/qty",
                )
            hint = "remove the trailing '/'; to divide, put spaces around it: /a / 2"
            if bracketed:
                hint = "put the whole path inside the brackets, e.g. [/my field/child]"
            raise self.error("a field path cannot end with '/'", self.pos, hint)

    def bracketed_path(self) -> Token:
        text = self.text
        start = self.pos
        close = text.find("]", start + 1)
        if close < 0:
            raise self.error(
                "unterminated bracketed field name",
                start,
                "close it with ']', e.g. [/my field]",
            )
        inner = text[start + 1 : close]
        if not inner.startswith("/"):
            raise self.error(
                "a bracketed field name must start with '/'",
                start + 1,
                "write it like [/my field]",
            )
        steps: list[PathStep] = []
        offset = start + 2
        for part in inner[1:].split("/"):
            if not part:
                raise self.error(
                    "empty field name inside brackets",
                    offset,
                    "remove the doubled or trailing '/', e.g. [/a b/c d]",
                )
            steps.append(PathStep(part))
            offset += len(part) + 1
        self.pos = close + 1
        self.subscripts(steps)
        self.no_trailing_slash(bracketed=True)
        return Token(Tok.PATH, start, text[start : self.pos], tuple(steps))

    def subscripts(self, steps: list[PathStep]) -> None:
        text = self.text
        while self.pos < len(text) and text[self.pos] == "[":
            open_pos = self.pos
            close = text.find("]", open_pos + 1)
            inner = text[open_pos + 1 : close].strip() if close >= 0 else ""
            if close < 0 or not inner.isdigit() or not inner.isascii() or len(inner) > 18:
                raise self.error(
                    "bad array subscript",
                    open_pos,
                    "a subscript is a non-negative whole number in brackets, e.g. /items[0]",
                )
            steps.append(PathStep(None, int(inner)))
            self.pos = close + 1

    def number(self) -> Token:
        text = self.text
        start = self.pos
        end = start
        n = len(text)
        while end < n and text[end] in _DIGITS:
            end += 1
        is_float = False
        if end < n and text[end] == ".":
            is_float = True
            end += 1
            while end < n and text[end] in _DIGITS:
                end += 1
        if end < n and text[end] in "eE":
            exp = end + 1
            if exp < n and text[exp] in "+-":
                exp += 1
            if exp < n and text[exp] in _DIGITS:
                is_float = True
                end = exp
                while end < n and text[end] in _DIGITS:
                    end += 1
        lexeme = text[start:end]
        self.pos = end
        value: int | float
        if is_float:
            value = float(lexeme)
        else:
            # Past 20 digits int() is pointless (and past 4300 it refuses).
            value = int(lexeme) if len(lexeme) <= 20 else _MAX_INT_LITERAL + 1
            if value > _MAX_INT_LITERAL:
                value = float(lexeme)
        return Token(Tok.NUMBER, start, lexeme, value)

    def string(self, start: int, *, raw: bool) -> Token:
        text = self.text
        quote = text[self.pos]
        i = self.pos + 1
        n = len(text)
        out: list[str] = []
        while True:
            if i >= n:
                raise self.error(
                    "unterminated string",
                    start,
                    f"close the string with a matching {quote} quote",
                )
            ch = text[i]
            if ch == quote:
                i += 1
                break
            if ch == "\\" and not raw:
                i = self._escape(i, out)
                continue
            out.append(ch)
            i += 1
        self.pos = i
        return Token(Tok.STRING, start, text[start:i], "".join(out))

    def _escape(self, i: int, out: list[str]) -> int:
        """Decode the escape starting at the backslash ``text[i]``; return the next index."""
        text = self.text
        n = len(text)
        if i + 1 >= n:
            raise self.error(
                "unterminated string (it ends with a backslash)",
                i,
                "write \\\\ for a literal backslash, or use a raw string r'...'",
            )
        c = text[i + 1]
        if c in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[c])
            return i + 2
        if c == "x":
            j = i + 2
            while j < n and j < i + 4 and text[j] in _HEX:
                j += 1
            if j == i + 2:
                raise self.error(
                    "\\x escape without hex digits",
                    i,
                    "write \\xHH with one or two hex digits, e.g. \\x41, or \\\\x for a "
                    "literal backslash and x",
                )
            out.append(chr(int(text[i + 2 : j], 16)))
            return j
        if c in _OCTAL:
            j = i + 1
            while j < n and j < i + 4 and text[j] in _OCTAL:
                j += 1
            out.append(chr(int(text[i + 1 : j], 8)))
            return j
        out.append(c)  # any other \c is the character itself
        return i + 2


def tokenize(text: str) -> list[Token]:
    """Split filter text into tokens, ending with one EOF token.

    Raises:
        FilterError: unterminated strings, bad escapes, bad subscripts, stray characters.
    """
    return _Lexer(text).run()
