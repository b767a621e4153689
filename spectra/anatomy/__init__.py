"""The head diagnosis' wing: which head is what (`diagnosis`: sink, previous-token, local, induction and retrieval
scores), what a head's weights allow (`weights`: the spectra of W_QK and W_OV), which approximation wins on which head
(`methodmap`), and a weight per key/value head read from a run (`headweights`, for a spectrum-guided cache budget)."""
