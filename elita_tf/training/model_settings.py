"""The model a run trains: from its architecture and size, from the model it fine-tunes, or as the run it resumes.

`TrainSettings` names a model by its `architecture`, `size` and overrides; its model
fields left None take the size's values or the backbone's defaults. `complete_settings` fills
them in, from a preset when the run fine-tunes one (`init_from`), so that everything after it sees
one concrete model.
"""

import dataclasses

from elita_tf.models import ElitaCausalLM
from elita_tf.models.architectures import ARCHITECTURES, MODEL_SIZES, architecture, check_carries_state
from elita_tf.models.elita_backbone import architecture_config
from elita_tf.models.presets import check_preset, read_preset_config
from elita_tf.training.run_directory import RunDirectory
from elita_tf.training.run_files import preset_of
from elita_tf.training.settings import TrainSettings, model_fields

# Fields a fine-tuned run takes from its model: the architecture, and every model field.
FINE_TUNED_FIELDS = ("architecture", "size", *model_fields())


def model_config(settings):
    """The run's backbone config: the `ElitaBackbone` arguments of its architecture at its size, with its overrides."""
    overrides = dict(MODEL_SIZES[settings.size])
    for field, argument in model_fields().items():
        if getattr(settings, field) is not None:
            overrides[argument] = getattr(settings, field)
    return architecture_config(settings.architecture, **overrides)


def preset_architecture(preset):
    """`(architecture, config)` of the model in a run directory or keras-hub preset.

    The config is complete (`architecture_config`'s fields), whatever the preset's age.

    Raises:
        ValueError: when the preset is not an ELiTA model's, or its model is none of
            `ARCHITECTURES` at any size.
    """
    config = read_preset_config(check_preset(preset_of(preset)))
    overrides = {argument: config[argument] for argument in model_fields().values() if argument in config}
    for name in ARCHITECTURES:
        try:
            candidate = architecture_config(name, **overrides)
        except ValueError:
            continue
        if all(config.get(key, value) == value for key, value in candidate.items()):
            return name, candidate
    raise ValueError(f"The model in {preset!r} is none of the architectures {sorted(ARCHITECTURES)}.")


def init_from_settings(settings, given=None):
    """`settings` with the architecture and model fields of the model `settings.init_from` names.

    Args:
        settings: a `TrainSettings`.
        given: the names of the fields the user set; None takes those that
            differ from `TrainSettings`' defaults.

    Raises:
        ValueError: naming a given field that disagrees with the model.
    """
    if settings.init_from is None:
        return settings
    name, config = preset_architecture(settings.init_from)
    values = {field: config[argument] for field, argument in model_fields().items()}
    values["architecture"] = name
    if "elita" not in config["blocks"]:
        values["position_mode"] = None  # a setting of ELiTA's blocks alone
    if given is None:
        defaults = {field.name: field.default for field in dataclasses.fields(TrainSettings)}
        given = [key for key in FINE_TUNED_FIELDS if getattr(settings, key) != defaults[key]]
    for key in given:
        if key == "size" or getattr(settings, key) != values[key]:
            stated = "its own size" if key == "size" else f"{key}={values[key]!r}"
            raise ValueError(
                f"--init-from {settings.init_from} is a model with {stated}: fine-tuning keeps its architecture. "
                f"Leave --{key.replace('_', '-')} out. Received: {key}={getattr(settings, key)!r}"
            )
    return dataclasses.replace(settings, **values)


def preset_tokenizer(preset):
    """The serialized SentencePiece model of a finished run directory or keras-hub preset."""
    return ElitaCausalLM.from_preset(preset_of(preset), load_weights=False).preprocessor.tokenizer.proto


def tokenizer_from_settings(settings, given=None):
    """`settings` with the vocabulary size of the tokenizer `settings.tokenizer_from` names.

    Args:
        settings: a `TrainSettings`.
        given: whether the user set `vocabulary_size`; None: whether it differs from the default.

    Raises:
        ValueError: when a given vocabulary size disagrees with the tokenizer's.
    """
    if settings.tokenizer_from is None:
        return settings
    tokenizer = ElitaCausalLM.from_preset(preset_of(settings.tokenizer_from), load_weights=False).preprocessor.tokenizer
    size = tokenizer.vocabulary_size()
    if given is None:
        default = {field.name: field.default for field in dataclasses.fields(TrainSettings)}["vocabulary_size"]
        given = settings.vocabulary_size != default
    if given and settings.vocabulary_size != size:
        raise ValueError(
            f"--tokenizer-from {settings.tokenizer_from} has {size} pieces: the model's vocabulary is the tokenizer's. "
            f"Leave --vocabulary-size out. Received: vocabulary_size={settings.vocabulary_size}"
        )
    return dataclasses.replace(settings, vocabulary_size=size)


def complete_settings(settings):
    """`settings` with every model field set: from the model it fine-tunes, else from its size and the
    backbone's defaults (`position_mode` is decided with the run directory, `resolve_position_mode`)."""
    settings = tokenizer_from_settings(init_from_settings(settings))
    config = model_config(settings)
    values = {field: config[argument] for field, argument in model_fields().items() if field != "position_mode"}
    return dataclasses.replace(settings, **values)


def resolve_position_mode(settings, run_path):
    """`settings` with `position_mode` decided, when it was left to the run (None).

    Resuming keeps the stored run's mode. An architecture that sets its own keeps it
    (`elita-reference`: `"length"`). Otherwise a new run trained in sequences
    never sees a position past `sequence_length`, so it holds later ones at
    the last trained position (`clamped`): the reference's sinusoids, run on,
    leave what they were trained on past about 16x the training length
    (docs/long-context.md). A new `carry_state` run gets `fixed`: its
    positions run on through each article and are trained there. `run_path`
    is the directory whose `run.json` a resumed run has (the chief's
    `output_dir` for every worker). An architecture without ELiTA blocks keeps None.
    """
    if settings.position_mode is not None or "elita" not in architecture(settings.architecture)["blocks"]:
        return settings
    run = RunDirectory(run_path)
    stored = None if settings.force_new or not run.has_progress() else run.read_manifest()
    if stored is not None:
        mode = stored["model"]["position_mode"]
    else:
        mode = architecture(settings.architecture).get("position_mode")
        mode = mode or ("fixed" if settings.carry_state else "clamped")
    return dataclasses.replace(settings, position_mode=mode)


def check_carry_state(settings):
    """Raises `ValueError` unless the run's model can carry its state (`ElitaBackbone.carries_state`)."""
    check_carries_state(model_config(settings))
