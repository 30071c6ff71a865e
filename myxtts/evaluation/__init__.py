"""How good is what it trained: measures of the speech a model produces.

    intelligibility.py   word error rate of an offline recognizer (pocketsphinx) on synthesized speech
    pronunciation.py     the recognizer's dictionary: CMU entries, plus ones derived for missing words
"""
