"""``aios check --fix``: the safe rewrites of findings (their ``fix`` kind), applied with
LibCST (imported only here) so the user's formatting stays."""

from __future__ import annotations

from collections.abc import Iterable

from aios.check.findings import CheckError, Finding


def fix_source(source: str, findings: Iterable[Finding]) -> str:
    """``source`` with the safe rewrites of ``findings`` applied (formatting kept)."""
    todo = {(f.line, f.col): f.fix for f in findings if f.fix}
    if not todo:
        return source
    try:
        import libcst as cst
        from libcst.metadata import PositionProvider
    except ImportError:
        raise CheckError(
            "--fix needs LibCST, which is not installed: pip install 'libcst>=1.0' "
            "(an aios-core dependency)"
        ) from None

    class Fix(cst.CSTTransformer):
        METADATA_DEPENDENCIES = (PositionProvider,)

        def _kind(self, node: cst.CSTNode) -> str:
            """The rewrite due at ``node``'s start (line, 1-based column), if any."""
            p = self.get_metadata(PositionProvider, node, None)
            return todo.get((p.start.line, p.start.column + 1), "") if p else ""

        def leave_SimpleStatementLine(  # noqa: N802 - LibCST's visitor names
            self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
        ) -> cst.BaseStatement:
            if len(original.body) != 1 or not isinstance(original.body[0], cst.Expr):
                return updated
            call = original.body[0].value
            if not isinstance(call, cst.Call) or self._kind(call) != "guard":
                return updated
            new_call = cst.ensure_type(updated.body[0], cst.Expr).value
            assert isinstance(new_call, cst.Call)
            func = cst.ensure_type(new_call.func, cst.Attribute)
            body = updated.with_changes(
                body=[cst.Expr(new_call.with_changes(func=_accelerator(func.attr.value)))],
                leading_lines=[],
            )
            test = cst.parse_expression("torch.accelerator.is_available()")
            return cst.If(
                test=test, body=cst.IndentedBlock(body=[body]), leading_lines=original.leading_lines
            )

        def leave_Call(  # noqa: N802
            self, original: cst.Call, updated: cst.Call
        ) -> cst.BaseExpression:
            kind = self._kind(original)
            if kind == "rename":
                func = cst.ensure_type(updated.func, cst.Attribute)
                return updated.with_changes(func=_accelerator(func.attr.value))
            if kind == "drop-backend":
                args = [
                    a
                    for i, a in enumerate(updated.args)
                    if not (
                        (a.keyword is None and i == 0 and isinstance(a.value, cst.SimpleString))
                        or (a.keyword is not None and a.keyword.value == "backend")
                    )
                ]
                return updated.with_changes(args=_tidy(args))
            if kind == "drop-fused":
                args = [a for a in updated.args if not (a.keyword and a.keyword.value == "fused")]
                return updated.with_changes(args=_tidy(args))
            return updated

    def _accelerator(name: str) -> cst.Attribute:
        return cst.Attribute(
            value=cst.Attribute(value=cst.Name("torch"), attr=cst.Name("accelerator")),
            attr=cst.Name(name),
        )

    def _tidy(args: list[cst.Arg]) -> list[cst.Arg]:
        if args and not isinstance(args[-1].comma, cst.MaybeSentinel):
            last = args[-1]
            # keep a trailing comma only where the call spans lines (the user's style)
            ws = getattr(last.comma, "whitespace_after", None)
            if not (isinstance(ws, cst.ParenthesizedWhitespace)):
                args[-1] = last.with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return args

    try:
        module = cst.metadata.MetadataWrapper(cst.parse_module(source))
    except cst.ParserSyntaxError as exc:
        raise CheckError(f"LibCST cannot parse it to rewrite ({exc.message})") from None
    return module.visit(Fix()).code
