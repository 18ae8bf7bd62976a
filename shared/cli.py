"""Generate an argparse CLI from a pydantic-settings class: one set of defaults.

Every field becomes `--kebab-name`; the environment variable `<PREFIX><NAME>` sets
the same field. Precedence: flag > environment > default.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Sequence
from typing import Annotated, Any, TypeVar, get_args, get_origin

from pydantic import AfterValidator, BeforeValidator, ValidationError
from pydantic_settings import BaseSettings

S = TypeVar("S", bound=BaseSettings)


def check_api_key(value: str | None) -> str | None:
    """The key as given, where an HTTP header can carry it (`Authorization: Bearer KEY`):
    printable ASCII, no spaces or control characters; else ValueError (the key unsaid)."""
    if value is not None and not all("!" <= c <= "~" for c in value):
        raise ValueError("a key is printable ASCII with no spaces or control characters "
                         "(it travels in an HTTP header)")
    return value


# An API key setting: an empty value (e.g. `LEAD_API_KEY=` from compose) means none.
ApiKey = Annotated[str | None, BeforeValidator(lambda v: None if v == "" else v),
                   AfterValidator(check_api_key)]


def _flag_type(annotation: Any) -> Any:
    """The scalar type argparse converts to; pydantic validates the rest."""
    origin = get_origin(annotation)
    if origin is not None:
        scalar = [a for a in get_args(annotation) if a is not type(None)]
        return _flag_type(scalar[0]) if len(scalar) == 1 else str
    return annotation if annotation in (int, float, str) else str


def _help(description: str, default: Any) -> str:
    """A flag's description and its default, unless it has none to show, or the
    description says what it means in its own words."""
    if default in (None, "") or "(default:" in description:
        return description
    return f"{description} (default: {default})"


def cli(group: str, *flags: str, bare: str | None = None, repeat: bool = False,
        negative: str | None = None) -> dict[str, Any]:
    """A field's CLI extras: its --help section, more names for its flag (`-c`, a short
    one first, or llama-server's), what the flag means given bare (`-fa`: on), whether
    it may be given again, adding to its list (`-ot a=CPU -ot b=CPU`: a=CPU,b=CPU), and
    a bool's negative name beside its --no- one (`-nkvo`)."""
    short = [f[1:] for f in flags[:1] if not f.startswith("--") and len(f) == 2]
    extra: dict[str, Any] = {"group": group, "flags": [f for f in flags if f[1:] not in short]}
    if short:
        extra["short"] = short[0]
    if bare is not None:
        extra["bare"] = bare
    if repeat:
        extra["repeat"] = True
    if negative is not None:
        extra["negative"] = negative
    return extra


class _Join(argparse.Action):
    """A flag given again: its values joined with commas, as llama-server adds each."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        before = getattr(namespace, self.dest, None)
        setattr(namespace, self.dest, values if before is None else f"{before},{values}")


def _extra(field: Any) -> dict[str, Any]:
    """A field's CLI extras: `short` (-x), `flags` (more names, e.g. llama-server's),
    `bare` (the value a flag given without one means), `repeat` (given again: added to),
    `group` (its --help section)."""
    extra = field.json_schema_extra
    return extra if isinstance(extra, dict) else {}


def _flags(name: str, extra: dict[str, Any]) -> list[str]:
    short = [f"-{extra['short']}"] if extra.get("short") else []
    return [*short, f"--{name.replace('_', '-')}", *extra.get("flags", [])]


class _Negatable(argparse.BooleanOptionalAction):
    """A bool flag that also takes a negative name of llama-server's (`-nkvo`, as
    --no-kv-offload), listed with its others."""

    def __init__(self, option_strings: Sequence[str], dest: str, negative: str,
                 **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.negative = negative
        self.option_strings.append(negative)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        if option_string == self.negative:
            setattr(namespace, self.dest, False)
        else:
            super().__call__(parser, namespace, values, option_string)


def _bool_action(extra: dict[str, Any]) -> dict[str, Any]:
    """A bool field's argparse action: --name/--no-name, and its negative name if any."""
    if "negative" in extra:
        return {"action": _Negatable, "negative": extra["negative"]}
    return {"action": argparse.BooleanOptionalAction}


def build_parser(settings_cls: type[S], prog: str, description: str) -> argparse.ArgumentParser:
    prefix = settings_cls.model_config.get("env_prefix", "")
    # no abbreviations: llama-server's --draft would be taken for --draft-len
    parser = argparse.ArgumentParser(prog=prog, description=description, allow_abbrev=False)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for name, field in settings_cls.model_fields.items():
        extra = _extra(field)
        title = extra.get("group")
        where = groups.setdefault(title, parser.add_argument_group(title)) if title else parser
        help_text = f"{_help(field.description or '', field.default)} " \
                    f"[env {prefix}{name.upper()}]"
        help_text = help_text.replace("%", "%%")  # argparse %-formats help: keep a % as is
        if field.annotation is bool:
            where.add_argument(*_flags(name, extra), dest=name, **_bool_action(extra),
                               default=argparse.SUPPRESS, help=help_text)
            continue
        how = {"nargs": "?", "const": extra["bare"]} if "bare" in extra else {}
        if extra.get("repeat"):
            how["action"] = _Join
        # a field that reads words itself (-ngl all) gets them as text
        words = any(isinstance(m, BeforeValidator) for m in field.metadata)
        where.add_argument(*_flags(name, extra), dest=name,
                           type=str if words else _flag_type(field.annotation),
                           default=argparse.SUPPRESS, help=help_text, **how)
    return parser


def parse_settings(settings_cls: type[S], prog: str, description: str,
                   argv: Sequence[str] | None = None) -> S:
    """Parse flags over env vars; a bad value is a one-line error and exit 2."""
    parser = build_parser(settings_cls, prog, description)
    unknown = unknown_short_flags(parser, sys.argv[1:] if argv is None else argv)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    flags = vars(parser.parse_args(argv))
    try:
        return settings_cls(**flags)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]).replace("_", "-")
        message = str(first["msg"]).removeprefix("Value error, ")  # (pydantic's prefix)
        parser.error(f"{where}: {message}" if where else message)  # (none: flags together)
    raise AssertionError("unreachable")


def readable_file(value: str | None) -> str | None:
    """A flag's file, as given, where it can be read as text (None: none given); else
    ValueError naming it and why."""
    if value is not None:
        try:
            with open(value, encoding="utf-8") as f:
                f.read(1)
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read {value}: {getattr(exc, 'strerror', None) or exc}") \
                from None
    return value


def unknown_short_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """llama-server's one-dash names the parser does not know (-ctxcp): argparse
    would read them as a short flag and its value run together (-c txcp)."""
    known = parser._option_string_actions
    return [arg for arg in argv if re.fullmatch(r"-[A-Za-z][A-Za-z0-9-]+", arg.split("=")[0])
            and arg.split("=")[0] not in known]


def setup_logging(level: str, file: str | None = None) -> None:
    """Log at `level` to stderr, and to `file` too where one is given."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if file is not None:
        handlers.append(logging.FileHandler(file, encoding="utf-8"))
    logging.basicConfig(
        level=level.upper(), handlers=handlers,
        format="%(asctime)s.%(msecs)03d %(name)s %(levelname)s %(message)s", datefmt="%H:%M:%S",
    )
    if level.upper() != "DEBUG":  # one line per HTTP request is noise at info level
        logging.getLogger("httpx").setLevel(logging.WARNING)


def fail(message: str) -> None:
    """A one-line CLI error: no traceback for problems the user can fix."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(1)
