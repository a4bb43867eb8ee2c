"""A run's data: its corpus read, its tokenizer trained or reused, every split tokenized into files and cut.

Everything is checked before the run directory is written: a split too short for one sequence or
one batch stops the run before `run.json` exists, so following the error's advice is not refused
as another run.
"""

import dataclasses
import hashlib
import os

import keras

from elita_tf.data import lm_dataset, load_corpus, sample_text, stream_steps_per_epoch, train_sentencepiece
from elita_tf.data.token_files import FileSequences, TokenFile, cached_token_file
from elita_tf.data.text_files import TextCorpus, data_kind
from elita_tf.models import ElitaCausalLMPreprocessor
from elita_tf.training.checkpoints import run_preprocessor
from elita_tf.training.manifest import legacy_corpus_record, requested_manifest
from elita_tf.training.model_settings import model_config, preset_tokenizer
from elita_tf.training.run_directory import RunDirectoryError, read_manifest, write_atomically
from elita_tf.training.run_files import TOKENIZER_FILE


def sha256(data):
    return hashlib.sha256(data).hexdigest()


@dataclasses.dataclass(frozen=True)
class RunSplit:
    """A split of a run as training reads it: its token files, and the training examples cut from them.

    Attributes:
        tokens: the `TokenFile` of the split, in order.
        examples: `FileSequences` of `sequence_length + 1` tokens.
        packed: whether an example holds documents back to back that never see each other.
    """

    tokens: TokenFile
    examples: FileSequences
    packed: bool

    def dataset(self, batch_size, **kwargs):
        """`lm_dataset` of the examples (packed, they carry their documents' starts)."""
        return lm_dataset(self.examples, batch_size, document_starts=self.packed, **kwargs)


@dataclasses.dataclass(frozen=True)
class PreparedRun:
    """What `prepare_run` checked and made ready to train.

    Attributes:
        config: the `ElitaBackbone` arguments.
        splits: `{split: RunSplit}`.
        preprocessor: the `ElitaCausalLMPreprocessor` of the run's one `ElitaTokenizer`, which wrote the token
            files and goes into the final preset.
    """

    config: dict
    splits: dict
    preprocessor: ElitaCausalLMPreprocessor


def load_settings_corpus(settings):
    """`load_corpus` of the text `settings` names, as `(line, starts_document)` pairs: `(splits, data)`."""
    return load_corpus(settings.corpus, seed=settings.seed, document_starts=True)


def prepare_run(settings, run_dir, splits, data):
    """Checks the directory against the request, then the tokenizer and the sequences of the three splits.

    A new run trains the tokenizer, cuts every split, and only then writes
    the tokenizer and `run.json`; a resumed one reuses its tokenizer after
    checking its hash. Returns a `PreparedRun`.
    """
    config = model_config(settings)
    manifest = requested_manifest(settings, config, data)
    compared = manifest
    written = None if settings.force_new else read_manifest(run_dir.path, upgrade=False)
    recorded = written and legacy_corpus_record(written)
    if recorded and data_kind(settings.corpus.data) in ("text", "jsonl"):
        # An older run hashed its text with its settings' old names: the same text, hashed as it hashed it.
        old_hash = TextCorpus(settings.corpus, settings.seed).sha256(recorded)
        compared = {**manifest, "data": {**manifest["data"], "sha256": old_hash}}
    stored = run_dir.check_manifest(compared)
    tokenizer_path = run_dir.file(TOKENIZER_FILE)
    # The splits hold (line, starts_document) pairs; the tokenizer trains on the lines.
    pairs, splits = splits, {split: pairs.map(lambda line, _: line) for split, pairs in splits.items()}
    reused = settings.init_from or settings.tokenizer_from  # fine-tuning keeps the model's own tokenizer
    if stored is None and reused is not None:
        proto = preset_tokenizer(reused)
    elif stored is None:
        text = sample_text(splits["train"], settings.tokenizer_sample_bytes, seed=settings.seed)
        proto = train_sentencepiece(
            text, vocabulary_size=settings.vocabulary_size, seed=settings.seed, byte_fallback=settings.byte_fallback
        )
    else:
        proto = open(tokenizer_path, "rb").read() if os.path.exists(tokenizer_path) else b""
        if sha256(proto) != stored["tokenizer_sha256"]:
            raise RunDirectoryError(
                f"{tokenizer_path} is missing or is not the tokenizer this run was trained with "
                f"(sha256 {stored['tokenizer_sha256'][:12]}...). Restore it, or use --force-new."
            )
    # The run's one tokenizer: it writes the token files and goes into the final preset.
    preprocessor = run_preprocessor(proto, settings.sequence_length)
    run_splits = {}
    bar = keras.utils.Progbar(None, unit_name="token") if settings.verbose == 1 else None
    for split in pairs:
        # Each split tokenized once into files, reused by any later run or evaluation on the same text and tokenizer.
        try:
            progress = bar.add if bar else None
            tokens = cached_token_file(
                pairs[split], preprocessor.tokenizer, data["sha256"], split, settings.vocabulary_size, progress
            )
            cut = FileSequences(tokens, settings.sequence_length + 1)
            if not len(cut):
                raise ValueError(f"The corpus is shorter than one sequence of {settings.sequence_length + 1} tokens.")
            if split == "train" and settings.carry_state:  # read as one stream
                stream_steps_per_epoch(len(tokens), settings.batch_size, settings.sequence_length)
            elif len(cut) < settings.batch_size:  # checked before the run writes anything
                raise ValueError(
                    f"{len(cut)} sequences of {settings.sequence_length + 1} tokens make no full batch of "
                    f"{settings.batch_size}: lower --batch-size or --sequence-length, or give it more text."
                )
        except ValueError as error:
            source = data.get("corpus", {}).get(f"{split}_data") or data["dataset"]  # the files given for it
            raise ValueError(f"The {split} split ({source}): {error}") from None
        run_splits[split] = RunSplit(tokens, cut, settings.pack_documents)
    if bar is not None and bar._seen_so_far:  # ends its line: Keras' "Epoch 1/N" followed it on the same one
        bar.update(bar._seen_so_far, finalize=True)
    if stored is None:
        write_atomically(tokenizer_path, proto)
        run_dir.write_manifest({**manifest, "tokenizer_sha256": sha256(proto)})
    return PreparedRun(config, run_splits, preprocessor)
