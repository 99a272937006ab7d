"""An independent generator of large synthetic distributed-training failures, and its scorer.

`python -m lab.synth --out DIR --jobs N --seed S [--ranks 512,1024,2048,4096]` writes DIR/cases/<job>/...,
DIR/labels.tsv (the format of ../shared/corpus/README.md) and DIR/truth/<job>.json (what the story did);
`python -m lab.synth.score DIR` runs rootrank on every job and prints want/got per job.

The message formats come from the libraries' own sources and from logs users posted (see formats.py), the
layouts from how clusters capture output (layouts.py); nothing here is derived from rootrank's rules or
its simulator.
"""
