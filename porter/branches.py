"""Keeping the branch of an `if` whose test a rule has decided (a CUDA availability test on
XLA, a CUDA tensor test in a JAX port): the statement becomes the statements of the branch,
with the comments of the statement and of the branch kept, an `elif` chain kept as the
statement, and what followed a branch that returns dropped."""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import libcst as cst

from porter.rules import Fix


def take_branch(rule, stmt: cst.If, value: bool, index: int, emptied_if: Optional[Callable] = None):
    """The fix of ``rule`` (visiting now, ``stmt`` at ``rule.ctx.ancestors[index]``) keeping
    the branch an `if` whose test folds to ``value`` takes; None where the statement's place
    does not allow it. ``emptied_if(ancestors, block)``: the enclosing `if` (and whether it is
    alone in its block) that dropping the statement leaves empty, removed with it.

    A statement `if True: A ... ` -> A; `if False: A` -> nothing (and an enclosing `if flag:`
    left empty goes too); `if False: A else: B` -> B; `if False: A elif C: ...` -> `if C: ...`.
    An `elif True: A ...` -> `else: A`; `elif False: A [rest]` -> [rest].
    """
    negated = not value
    anc = rule.ctx.ancestors
    owner = anc[index - 1] if index >= 1 else None
    if isinstance(owner, cst.If) and owner.orelse is stmt:
        return Fix((rule.replace(stmt, _elif_branch(negated)),))
    if not isinstance(owner, (cst.IndentedBlock, cst.Module)):
        return None
    siblings = list(owner.body)
    at = next(i for i, s in enumerate(siblings) if s is stmt)
    alone = len(siblings) == 1
    if negated and stmt.orelse is None and alone and isinstance(owner, cst.IndentedBlock):
        outer = emptied_if(anc, index - 1) if emptied_if is not None else None
        if outer is not None:
            gone, last = outer
            return Fix((rule.replace(gone, cst.SimpleStatementLine([cst.Pass()], leading_lines=gone.leading_lines)
                                     if last else cst.RemoveFromParent()),))
    carried: list[cst.EmptyLine] = []  # comment lines that lose their place, filled by `apply`

    def apply(updated: cst.CSTNode):
        assert isinstance(updated, cst.If)
        if negated and isinstance(updated.orelse, cst.If):
            # the `elif` chain is the whole statement now: `elif C:` -> `if C:`
            chain = updated.orelse
            return chain.with_changes(leading_lines=[*updated.leading_lines, *chain.leading_lines])
        if negated:
            suite = updated.orelse.body if isinstance(updated.orelse, cst.Else) else None
        else:
            suite = updated.body
        head, chosen, foot = _suite_parts(suite)
        if all(_is_pass(s) for s in chosen):  # nothing left to keep (another rule's edits may leave `pass`)
            if alone and not isinstance(owner, cst.Module):
                return cst.SimpleStatementLine([cst.Pass()], leading_lines=updated.leading_lines)
            carried.extend(updated.leading_lines)
            return cst.RemoveFromParent()
        first = chosen[0]
        chosen[0] = first.with_changes(leading_lines=[*updated.leading_lines, *head, *first.leading_lines])
        carried.extend(foot)
        return cst.FlattenSentinel(chosen)

    edits = []
    chosen_suite = stmt.body if not negated else stmt.orelse.body if isinstance(stmt.orelse, cst.Else) else None
    if not (negated and isinstance(stmt.orelse, cst.If)) and _ends_flow(chosen_suite):
        # the kept branch returns (raises, ...): what followed the `if` in its block never runs
        edits = [rule.replace(later, cst.RemoveFromParent()) for later in siblings[at + 1:]]

    # comments that ended the kept block (or stood above a removed statement) go before the next
    # statement, or to the end of the enclosing block
    kept = stmt.body if not negated else stmt.orelse.body if isinstance(stmt.orelse, cst.Else) else None
    removed = negated and stmt.orelse is None and not (alone and isinstance(owner, cst.IndentedBlock))
    if edits or not (isinstance(kept, cst.IndentedBlock) and kept.footer) and not (removed and stmt.leading_lines):
        return Fix((rule.replace(stmt, apply), *edits))
    if at + 1 < len(siblings):
        carry = rule.replace(siblings[at + 1], lambda n: n.with_changes(leading_lines=_merge_lines(carried, n.leading_lines)))
    else:
        carry = rule.replace(owner, lambda n: n.with_changes(footer=[*carried, *n.footer]))
    return Fix((rule.replace(stmt, apply), carry))


def _merge_lines(carried: list, own: Sequence[cst.EmptyLine]) -> list:
    """The comment lines of a removed statement before the next one's own lines; its blank
    lines only where the next statement has none (the layout keeps one gap, not two)."""
    if own and own[0].comment is None:
        carried = [line for line in carried if line.comment is not None]
    return [*carried, *own]



def _ends_flow(suite: Optional[cst.BaseSuite]) -> bool:
    """The block's last statement is a `return`, `raise`, `continue` or `break`."""
    if suite is None:
        return False
    last = suite.body[-1] if isinstance(suite, cst.SimpleStatementSuite) else None
    if isinstance(suite, cst.IndentedBlock) and isinstance(suite.body[-1], cst.SimpleStatementLine):
        last = suite.body[-1].body[-1]
    return isinstance(last, (cst.Return, cst.Raise, cst.Continue, cst.Break))



def _elif_branch(negated: bool):
    """The replacement of an `elif` that tests availability alone; its own leading comments
    go with it when its branch is dropped."""

    def apply(updated: cst.CSTNode):
        assert isinstance(updated, cst.If)
        if not negated:
            return cst.Else(body=updated.body, leading_lines=updated.leading_lines,
                            whitespace_before_colon=updated.whitespace_after_test)
        return updated.orelse if updated.orelse is not None else cst.RemoveFromParent()

    return apply



def _suite_parts(suite: Optional[cst.BaseSuite]) -> tuple[list[cst.EmptyLine], list[cst.BaseStatement], list[cst.EmptyLine]]:
    """A branch's statements as block statements, with the comment on its header line (as a
    comment line to put before them) and the comment lines that end it."""
    if suite is None:
        return [], [], []
    if isinstance(suite, cst.SimpleStatementSuite):
        return [], [cst.SimpleStatementLine(list(suite.body), trailing_whitespace=suite.trailing_whitespace)], []
    assert isinstance(suite, cst.IndentedBlock)
    head = []
    if suite.header.comment is not None:
        head.append(cst.EmptyLine(indent=True, comment=suite.header.comment))
    return head, list(suite.body), list(suite.footer)



def _is_pass(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(isinstance(s, cst.Pass) for s in stmt.body)
