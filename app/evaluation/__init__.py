"""Hospitals' test predictions judged for a clinician: what a model does at a threshold, the threshold proposed for a
sensitivity floor, the verdict rule, and the words and tables the pages show.

FedSAF paper (Miao et al., 2025), Sec. 5 reports accuracy per client; the dashboard adds what a clinician reads
next. One module per concern, each importing only those before it:

* `app.evaluation.metrics`: the ROC curve and AUC, the confusion matrix and the operating point at a threshold,
  ranked example tiles, slides counted from tile names;
* `app.evaluation.threshold`: the threshold that reaches a target sensitivity, alone and with its margin (the
  lower end of the 95% interval on the slides' effective number of tiles), and the split that chooses it;
* `app.evaluation.words`: the warnings in words (a good AUC hiding a poor operating point, too few slides, a
  sensitivity below the target) and what a proposed threshold does on test;
* `app.evaluation.verdict`: the scorecard of one hospital and the verdict rule against a clinical floor;
* `app.evaluation.tables`: the scorecard, judgement and verdict-summary tables and a verdict's word on a badge.
* `app.evaluation.classes`: a model of more than two classes (issue 51): its predictions, accuracy, macro
  one-vs-rest AUC and confusion matrix by class, and the one sentence naming the binary notions that do not apply.

This package imports nothing of its own here, so that importing one module loads only what it needs.
"""
