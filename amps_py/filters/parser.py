"""Tokens to a tree of :mod:`~amps_py.filters.nodes`, by recursive descent.

Grammar, loosest binding first (keywords are case-insensitive)::

    filter     := or_expr EOF
    or_expr    := and_expr (OR and_expr)*
    and_expr   := not_expr (AND not_expr)*
    not_expr   := NOT not_expr | predicate
    predicate  := sum [ (= | == | != | <> | < | <= | > | >=) sum
                      | [NOT] BETWEEN sum AND sum
                      | [NOT] IN '(' sum (',' sum)* ')'
                      | [NOT] LIKE 'pattern'
                      | [NOT] (BEGINS | ENDS) WITH '(' sum (',' sum)* ')'
                      | IS [NOT] (NULL | NAN) ]
    sum        := product (('+' | '-') product)*
    product    := unary (('*' | '/' | '%' | MOD) unary)*
    unary      := ('-' | '+') unary | primary
    primary    := NUMBER | STRING | PATH | NULL | TRUE | FALSE
                | NAME '(' [or_expr (',' or_expr)*] ')' | '(' or_expr ')'

Comparisons do not chain (``1 < /a < 5`` is an error that suggests AND).
"""

from __future__ import annotations

from .errors import FilterError
from .lexer import KEYWORDS, Tok, Token, tokenize
from .nodes import (
    Affix,
    Arith,
    Between,
    Call,
    Compare,
    InList,
    IsTest,
    Like,
    Literal,
    Logical,
    Negate,
    Node,
    Not,
    Path,
)

# How many parentheses / NOTs / unary signs may nest. Each level costs about ten Python
# stack frames while parsing, so this keeps parsing far below the recursion limit.
MAX_NESTING = 32

# Height of the finished tree. Evaluation calls one closure per level; the limit keeps a
# filter from exhausting the stack of the server task that evaluates it.
MAX_DEPTH = 64

_COMPARISON_OPS = {"=": "=", "==": "=", "!=": "!=", "<>": "!=", "<": "<", "<=": "<="}
_COMPARISON_OPS |= {">": ">", ">=": ">="}
_PREDICATE_WORDS = frozenset({"BETWEEN", "IN", "LIKE", "BEGINS", "ENDS", "IS"})

_VALUE_HINT = (
    "a value is a field (/name), a number, a quoted string, NULL, TRUE, FALSE, "
    "a function call like UPPER(/name), or an expression in parentheses"
)


def _describe(tok: Token) -> str:
    if tok.kind is Tok.EOF:
        return "the end of the filter"
    if tok.kind is Tok.WORD and tok.value in KEYWORDS:
        return f"keyword {tok.value}"
    return repr(tok.text)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokenize(text)
        self.i = 0
        self.nesting = 0

    # -- token helpers -------------------------------------------------------------------

    def peek(self, ahead: int = 0) -> Token:
        return self.tokens[min(self.i + ahead, len(self.tokens) - 1)]

    def advance(self) -> Token:
        tok = self.tokens[self.i]
        if tok.kind is not Tok.EOF:
            self.i += 1
        return tok

    def at_word(self, *words: str, ahead: int = 0) -> bool:
        tok = self.peek(ahead)
        return tok.kind is Tok.WORD and tok.value in words

    def at_op(self, *ops: str) -> bool:
        tok = self.peek()
        return tok.kind is Tok.OP and tok.value in ops

    def error(self, problem: str, pos: int, hint: str = "") -> FilterError:
        return FilterError(problem, text=self.text, position=pos, hint=hint)

    def enter(self, pos: int) -> None:
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise self.error(
                f"expression nested more than {MAX_NESTING} levels deep",
                pos,
                "remove redundant parentheses or NOTs, or split the filter into simpler parts",
            )

    def leave(self) -> None:
        self.nesting -= 1

    def depth(self, pos: int, *children: Node) -> int:
        depth = 1 + max(child.depth for child in children)
        if depth > MAX_DEPTH:
            raise self.error(
                f"expression is more than {MAX_DEPTH} operations deep",
                pos,
                "shorten long chains of arithmetic, or use IN (...) instead of repeated "
                "comparisons",
            )
        return depth

    def expect_rparen(self, open_pos: int, what: str, *, is_list: bool = False) -> None:
        tok = self.peek()
        if tok.kind is Tok.RPAREN:
            self.advance()
            return
        what = f" {what}" if what else ""
        raise self.error(
            f"expected ')' to close the '(' at column {open_pos + 1}{what}, found {_describe(tok)}",
            tok.pos,
            "separate the items with ',' and close the list with ')'"
            if is_list
            else "add the missing ')', or check for a missing operator before this point",
        )

    # -- grammar -------------------------------------------------------------------------

    def parse(self) -> Node:
        node = self.or_expr()
        tok = self.peek()
        if tok.kind is not Tok.EOF:
            raise self.trailing(tok)
        return node

    def trailing(self, tok: Token) -> FilterError:
        if tok.kind is Tok.RPAREN:
            return self.error(
                "unbalanced ')'", tok.pos, "remove it or add the matching '(' before it"
            )
        if tok.kind is Tok.WORD and tok.value == "NOT":
            return self.error(
                "unexpected NOT after a complete condition",
                tok.pos,
                "NOT goes before a condition (NOT /a = 1) or before BETWEEN, IN, LIKE, "
                "BEGINS WITH, ENDS WITH; use AND NOT / OR NOT to combine",
            )
        if tok.kind is Tok.WORD and tok.value not in KEYWORDS:
            return self.error(
                f"unexpected word {tok.text!r} after a complete expression",
                tok.pos,
                "join conditions with AND or OR; fields start with '/' and strings need quotes",
            )
        return self.error(
            f"unexpected {_describe(tok)} after a complete expression",
            tok.pos,
            "join conditions with AND or OR, and check for a missing operator",
        )

    def or_expr(self) -> Node:
        first = self.and_expr()
        if not self.at_word("OR"):
            return first
        operands = [first]
        while self.at_word("OR"):
            self.advance()
            operands.append(self.and_expr())
        return Logical(first.pos, "OR", tuple(operands), self.depth(first.pos, *operands))

    def and_expr(self) -> Node:
        first = self.not_expr()
        if not self.at_word("AND"):
            return first
        operands = [first]
        while self.at_word("AND"):
            self.advance()
            operands.append(self.not_expr())
        return Logical(first.pos, "AND", tuple(operands), self.depth(first.pos, *operands))

    def not_expr(self) -> Node:
        if self.at_word("NOT"):
            tok = self.advance()
            self.enter(tok.pos)
            operand = self.not_expr()
            self.leave()
            return Not(tok.pos, operand, self.depth(tok.pos, operand))
        return self.predicate()

    def predicate(self) -> Node:
        left = self.sum()
        node = self.predicate_tail(left)
        if node is left:
            return node
        tok = self.peek()
        if (tok.kind is Tok.OP and tok.value in _COMPARISON_OPS) or (
            tok.kind is Tok.WORD and tok.value in _PREDICATE_WORDS
        ):
            raise self.error(
                "comparisons cannot be chained",
                tok.pos,
                "combine them with AND, e.g. /a > 1 AND /a < 5 (or use BETWEEN)",
            )
        return node

    def predicate_tail(self, left: Node) -> Node:
        tok = self.peek()
        if tok.kind is Tok.OP and tok.value in _COMPARISON_OPS:
            self.advance()
            right = self.sum()
            op = _COMPARISON_OPS[tok.text]
            return Compare(tok.pos, op, left, right, self.depth(tok.pos, left, right))
        if tok.kind is not Tok.WORD:
            return left
        negated = False
        if tok.value == "NOT":
            if not self.at_word("BETWEEN", "IN", "LIKE", "BEGINS", "ENDS", ahead=1):
                raise self.error(
                    f"expected BETWEEN, IN, LIKE, BEGINS WITH or ENDS WITH after NOT, "
                    f"found {_describe(self.peek(1))}",
                    self.peek(1).pos,
                    "to negate a whole condition put NOT in front of it: NOT (/a = 1)",
                )
            self.advance()
            negated = True
            tok = self.peek()
        word = tok.value
        if word == "BETWEEN":
            return self.between(left, negated)
        if word == "IN":
            self.advance()
            items = self.value_list(tok, "IN", "/a IN (1, 2, 3)")
            return InList(tok.pos, negated, left, items, self.depth(tok.pos, left, *items))
        if word == "LIKE":
            return self.like(left, negated)
        if word in ("BEGINS", "ENDS"):
            self.advance()
            with_tok = self.peek()
            example = f"/a {word} WITH ('x', 'y')"
            if not self.at_word("WITH"):
                raise self.error(
                    f"expected WITH after {word}, found {_describe(with_tok)}",
                    with_tok.pos,
                    f"write {example}",
                )
            self.advance()
            items = self.value_list(tok, f"{word} WITH", example)
            return Affix(
                tok.pos, str(word), negated, left, items, self.depth(tok.pos, left, *items)
            )
        if word == "IS":
            return self.is_test(left)
        return left

    def between(self, left: Node, negated: bool) -> Node:
        tok = self.advance()
        low = self.sum()
        if not self.at_word("AND"):
            found = self.peek()
            raise self.error(
                f"expected AND in BETWEEN, found {_describe(found)}",
                found.pos,
                "write /a BETWEEN 1 AND 5",
            )
        self.advance()
        high = self.sum()
        return Between(tok.pos, negated, left, low, high, self.depth(tok.pos, left, low, high))

    def like(self, left: Node, negated: bool) -> Node:
        tok = self.advance()
        pattern = self.peek()
        if pattern.kind is not Tok.STRING:
            raise self.error(
                f"LIKE needs a quoted pattern, found {_describe(pattern)}",
                pattern.pos,
                "write /a LIKE '^abc' (use r'...' to keep backslashes, e.g. r'\\d+')",
            )
        self.advance()
        assert isinstance(pattern.value, str)
        return Like(tok.pos, negated, left, pattern.value, pattern.pos, self.depth(tok.pos, left))

    def is_test(self, left: Node) -> Node:
        tok = self.advance()
        negated = False
        if self.at_word("NOT"):
            self.advance()
            negated = True
        what = self.peek()
        if not self.at_word("NULL", "NAN"):
            raise self.error(
                f"expected NULL or NAN after IS{' NOT' if negated else ''}, "
                f"found {_describe(what)}",
                what.pos,
                "write /a IS NULL, /a IS NOT NULL or /a IS NAN; compare values with =",
            )
        self.advance()
        return IsTest(tok.pos, str(what.value), negated, left, self.depth(tok.pos, left))

    def value_list(self, op_tok: Token, op_name: str, example: str) -> tuple[Node, ...]:
        open_tok = self.peek()
        if open_tok.kind is not Tok.LPAREN:
            raise self.error(
                f"{op_name} needs a list in parentheses, found {_describe(open_tok)}",
                open_tok.pos,
                f"write {example}",
            )
        self.advance()
        self.enter(open_tok.pos)
        if self.peek().kind is Tok.RPAREN:
            raise self.error(
                f"empty list after {op_name}",
                self.peek().pos,
                f"give at least one value, e.g. {example}",
            )
        items = [self.sum()]
        while self.peek().kind is Tok.COMMA:
            self.advance()
            items.append(self.sum())
        self.expect_rparen(open_tok.pos, f"after {op_name}", is_list=True)
        self.leave()
        return tuple(items)

    def sum(self) -> Node:
        left = self.product()
        while self.at_op("+", "-"):
            tok = self.advance()
            right = self.product()
            left = Arith(tok.pos, str(tok.value), left, right, self.depth(tok.pos, left, right))
        return left

    def product(self) -> Node:
        left = self.unary()
        while self.at_op("*", "/", "%") or self.at_word("MOD"):
            tok = self.advance()
            op = "%" if tok.value == "MOD" else str(tok.value)
            right = self.unary()
            left = Arith(tok.pos, op, left, right, self.depth(tok.pos, left, right))
        return left

    def unary(self) -> Node:
        if self.at_op("-", "+"):
            tok = self.advance()
            self.enter(tok.pos)
            operand = self.unary()
            self.leave()
            return Negate(tok.pos, str(tok.value), operand, self.depth(tok.pos, operand))
        return self.primary()

    def primary(self) -> Node:
        tok = self.peek()
        kind = tok.kind
        if kind is Tok.NUMBER:
            self.advance()
            assert isinstance(tok.value, int | float)
            return Literal(tok.pos, tok.value)
        if kind is Tok.STRING:
            self.advance()
            assert isinstance(tok.value, str)
            return Literal(tok.pos, tok.value or None)  # '' is NULL
        if kind is Tok.PATH:
            self.advance()
            assert isinstance(tok.value, tuple)
            return Path(tok.pos, tok.text, tok.value)
        if kind is Tok.LPAREN:
            self.advance()
            self.enter(tok.pos)
            inner = self.or_expr()
            self.expect_rparen(tok.pos, "")
            self.leave()
            return inner
        if kind is Tok.WORD:
            word = tok.value
            if word == "NULL":
                self.advance()
                return Literal(tok.pos, None)
            if word in ("TRUE", "FALSE"):
                self.advance()
                return Literal(tok.pos, word == "TRUE")
            if self.peek(1).kind is Tok.LPAREN and word not in KEYWORDS:
                return self.call()
            if word not in KEYWORDS:
                before = self.tokens[self.i - 1] if self.i else None
                if (
                    before is not None
                    and before.kind is Tok.OP
                    and before.value == "/"
                    and before.pos + 1 == tok.pos
                ):
                    raise self.error(
                        f"unknown word {tok.text!r} after '/'",
                        tok.pos,
                        f"after a value '/' means division; if you meant the field "
                        f"/{tok.text}, join the conditions with AND or OR",
                    )
                raise self.error(
                    f"unknown word {tok.text!r}",
                    tok.pos,
                    f"fields start with '/' (/{tok.text}), strings need quotes "
                    f"('{tok.text}'), and functions need parentheses ({tok.text}(...))",
                )
        if kind is Tok.EOF:
            raise self.error("the filter ends where a value was expected", tok.pos, _VALUE_HINT)
        if kind is Tok.OP and tok.value == "/":
            raise self.error(
                "unexpected '/'",
                tok.pos,
                "field names follow '/' directly (/name); to divide, write a / b",
            )
        raise self.error(f"expected a value, found {_describe(tok)}", tok.pos, _VALUE_HINT)

    def call(self) -> Node:
        name_tok = self.advance()
        open_tok = self.advance()
        self.enter(open_tok.pos)
        args: list[Node] = []
        if self.peek().kind is not Tok.RPAREN:
            args.append(self.or_expr())
            while self.peek().kind is Tok.COMMA:
                self.advance()
                args.append(self.or_expr())
        self.expect_rparen(open_tok.pos, f"of {name_tok.value}(", is_list=True)
        self.leave()
        depth = self.depth(name_tok.pos, *args) if args else 1
        return Call(name_tok.pos, str(name_tok.value), tuple(args), depth)


def parse(text: str) -> Node:
    """Parse filter text into a node tree.

    Raises:
        FilterError: the text is not a well-formed filter; the error names the problem,
            its column, and a fix.
    """
    return _Parser(text).parse()
