"""Exports of an `ElitaCausalLM`: a SavedModel for serving, a LiteRT file for phones (and its runner)."""

from elita_tf.export.litert import export_litert
from elita_tf.export.litert_model import LiteRTModel
from elita_tf.export.saved_model import export_saved_model, load_saved_model
