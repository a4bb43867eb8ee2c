"""Command-line flags made from the settings dataclasses: one flag a field, one help text a field.

`elita-train` and `elita-compare` take `TrainSettings` and its `CorpusSettings` as flags,
`elita-evaluate` the `CorpusSettings` of other text and `elita-recall` its `RecallSettings`: every
flag is the field of that name. A flag's
old name (`elita_tf.renames`) sets the same field, hidden from `--help`, with a warning.
"""

import argparse
import dataclasses
import re
import sys

from elita_tf.renames import RENAMED, deprecation
from elita_tf.settings_fields import default_text


def flag_help(settings_class, field, default_help=None):
    """A field's help text as `--help` shows it: fields as flags, no backticks, and the default (`default_help`
    in place of the field's, where an unset flag means something else: `"the run's"`)."""
    names = {f.name for f in dataclasses.fields(settings_class)}

    def as_flag(match):
        text = match.group(1)
        return "--" + text.replace("_", "-") if text in names else text

    text = field.metadata.get("help") or ""
    default = default_help or default_text(field)
    if default is not None and (field.type is not bool or field.default is not False):
        text += f" Default: {default}."
    return re.sub(r"`([^`]+)`", as_flag, text).replace("%", "%%")  # argparse formats help with %


class _OldFlag(argparse.Action):
    """A flag's old name: says so in one line on stderr (with `warn`), then does what today's flag does.

    It has no default of its own (today's flag sets the field's), and no help: `--help` shows today's.
    """

    def __init__(self, option_strings, dest, today, warn, **kwargs):
        self.today, self.warn = today, warn
        self.new_names = dict(zip(option_strings, today.option_strings))  # `--old`: `--new`, `--no-old`: `--no-new`
        kwargs.update(nargs=today.nargs, type=today.type, choices=today.choices, metavar=today.metavar)
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        new = self.new_names[option_string]
        if self.warn:
            received = option_string if self.nargs == 0 else f"{option_string} {values}"
            print(f"{parser.prog}: warning: {deprecation(option_string, new, received)}", file=sys.stderr)
        self.today(parser, namespace, values, new)


def add_flags(parser, settings_class, exclude=(), defaults=True, default_help=None, warn_old_names=True):
    """One flag for each field of the dataclass `settings_class` not in `exclude` (nested dataclasses: theirs).

    Each flag's help is its field's (`flag_help`). With
    `defaults=False` every flag is left unset (None) unless given and none is
    required: what was given can then be told from the defaults. `default_help`
    says what an unset flag means instead of the fields' defaults (`"the run's"`).
    A flag's old name (`RENAMED["flag"]`) sets the same field, hidden from
    `--help`, with a warning on stderr unless `warn_old_names=False` (a second
    parse of the same command line).
    """
    for field in dataclasses.fields(settings_class):
        if field.name in exclude:
            continue
        if field.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(field.default_factory):
            add_flags(parser, field.default_factory, exclude, defaults, default_help, warn_old_names)
            continue
        flag = "--" + field.name.replace("_", "-")
        help_text = flag_help(settings_class, field, default_help)
        if field.type is bool and field.default is not False:  # unset or on by default: `--flag` / `--no-flag`
            default = field.default if defaults else None
            today = parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        elif field.type is bool:
            today = parser.add_argument(flag, action="store_true", default=False if defaults else None, help=help_text)
        else:
            default = None if field.default is dataclasses.MISSING else field.default
            # A tuple field takes `nargs` values, each read by its `parse` (`setting(..., nargs="+", parse=int)`).
            kind = {"int": int, "float": float}.get(getattr(field.type, "__name__", ""), str)
            kind = field.metadata.get("parse") or kind
            today = parser.add_argument(
                flag,
                type=kind,
                nargs=field.metadata.get("nargs"),
                default=default if defaults else None,
                required=defaults and field.default is dataclasses.MISSING,
                choices=field.metadata.get("choices"),
                help=help_text,
            )
        for old in (old for old, new in RENAMED["flag"].items() if new == flag):
            names = [old, "--no-" + old[2:]] if len(today.option_strings) == 2 else [old]  # and `--no-old`
            parser.add_argument(*names, action=_OldFlag, dest=today.dest, today=today, warn=warn_old_names)
    return parser
