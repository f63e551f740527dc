"""Checkpoint weights as the engine's models want them: renamed, filtered, dequantized.

`names` decides from a tensor's name whether the text model needs it (MTP
layers and vision towers are skipped), `formats` picks the decoder for the
checkpoint's quantization (`fp8_block`, `int4_packed`), which turns quantized
modules into plain weights in the serving dtype.
"""
