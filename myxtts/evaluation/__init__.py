"""How good is what it trained: measures of the speech a model produces.

    intelligibility.py   word error rate of an offline recognizer (pocketsphinx) on synthesized speech
    pronunciation.py     the recognizer's dictionary: CMU entries, plus ones derived for missing words
    speaker.py           whose voice is it: an independent speaker encoder (resemblyzer's GE2E, in numpy)
    voices.py            voices training never heard, spoken by the model and measured with speaker.py
"""
