"""The model and its weights: EDEN's building blocks and its two weight halves, named as in the
official checkpoint (:mod:`.weights`); E_cond's computation, which both halves run (:mod:`.e_cond`);
synthetic weights, frames and conditions (:mod:`.synthetic`); the official checkpoint read and split
into the halves (:mod:`.checkpoint`), and ``hf://`` references to it (:mod:`.hub`)."""
