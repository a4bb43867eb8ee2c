"""Command-line flags made from the settings dataclasses: one flag a field, one help text a field.

`elita-train` and `elita-compare` take `TrainSettings` and its `CorpusSettings` as flags, and
`elita-evaluate` the `CorpusSettings` of other text: every flag is the field of that name.
"""

import argparse
import dataclasses
import re

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
    if default is not None and (field.type is not bool or field.default is None):
        text += f" Default: {default}."
    return re.sub(r"`([^`]+)`", as_flag, text).replace("%", "%%")  # argparse formats help with %


def add_flags(parser, settings_class, exclude=(), defaults=True, default_help=None):
    """One flag for each field of the dataclass `settings_class` not in `exclude` (nested dataclasses: theirs).

    Each flag's help is its field's (`flag_help`). With
    `defaults=False` every flag is left unset (None) unless given and none is
    required: what was given can then be told from the defaults. `default_help`
    says what an unset flag means instead of the fields' defaults (`"the run's"`).
    """
    for field in dataclasses.fields(settings_class):
        if field.name in exclude:
            continue
        if field.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(field.default_factory):
            add_flags(parser, field.default_factory, exclude, defaults, default_help)
            continue
        flag = "--" + field.name.replace("_", "-")
        help_text = flag_help(settings_class, field, default_help)
        if field.type is bool and field.default is None:  # unset means something else: `--flag` / `--no-flag`
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=help_text)
            continue
        if field.type is bool:
            parser.add_argument(flag, action="store_true", default=False if defaults else None, help=help_text)
            continue
        default = None if field.default is dataclasses.MISSING else field.default
        kind = {"int": int, "float": float}.get(getattr(field.type, "__name__", ""), str)
        parser.add_argument(
            flag,
            type=kind,
            default=default if defaults else None,
            required=defaults and field.default is dataclasses.MISSING,
            choices=field.metadata.get("choices"),
            help=help_text,
        )
    return parser
