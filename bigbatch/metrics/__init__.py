"""Sample-quality metrics: FID, IS, KID, precision/recall and density/coverage with the TF Inception of
2015-12-05 (equal to torch-fidelity's on the same images and weights), or fcd/cs/kcd/... with a
classifier trained on the data set itself.

    ext = get_extractor("inception")                  # weights from BIGBATCH_CACHE/weights, never fetched
    ref = reference_stats(data, ext)                  # computed once, cached by hash
    scores = evaluate(G_ema, data, ("fid", "is", "kid"), n=50_000, extractor=ext)
    scores = evaluate_images(open_images("samples/"), load_data("data.h5", 128), "fid,kid", extractor=ext)
    scores = evaluate_images(open_images("a.npz"), read_stats("fid_stats.npz"), "fid", extractor=ext)

The data set's own classifier (fcd) is trained by the classify task, above the metrics, and handed to them:
    ext = bigbatch.tasks.classify.features.classifier_extractor(data)    # trained once, cached by hash
"""

from bigbatch.metrics.cache import data_digest
from bigbatch.metrics.classifier import (
    ClassifierExtractor,
    ClassifierOptions,
    cached_classifier_extractor,
    load_classifier,
    run_classifier_extractor,
)
from bigbatch.metrics.evaluate import (
    METRICS,
    evaluate,
    evaluate_images,
    extractor_for,
    generated_features,
    image_features,
    parse_metrics,
    score,
)
from bigbatch.metrics.extractors import PIPELINE, get_extractor, preprocess, resize_tf_bilinear
from bigbatch.metrics.features import Extractor, extract, extract_sharded, moments_sharded
from bigbatch.metrics.fid import feature_stats, fid, frechet_distance
from bigbatch.metrics.image_sets import ImageFiles, any_size, open_images
from bigbatch.metrics.inception import InceptionV3, convert_torchscript, state_dict_from_torchscript
from bigbatch.metrics.inception_score import inception_score
from bigbatch.metrics.kid import kid
from bigbatch.metrics.manifold import density_coverage, precision_recall
from bigbatch.metrics.stats import ReferenceStats, holds_stats, load_stats, read_stats, reference_stats, save_stats
from bigbatch.user_cache import cache_dir

__all__ = [
    "METRICS",
    "PIPELINE",
    "ClassifierExtractor",
    "ClassifierOptions",
    "Extractor",
    "ImageFiles",
    "InceptionV3",
    "ReferenceStats",
    "any_size",
    "cache_dir",
    "cached_classifier_extractor",
    "load_classifier",
    "run_classifier_extractor",
    "convert_torchscript",
    "data_digest",
    "density_coverage",
    "evaluate",
    "evaluate_images",
    "extract",
    "extract_sharded",
    "extractor_for",
    "feature_stats",
    "fid",
    "frechet_distance",
    "generated_features",
    "get_extractor",
    "holds_stats",
    "image_features",
    "inception_score",
    "kid",
    "load_stats",
    "moments_sharded",
    "open_images",
    "parse_metrics",
    "precision_recall",
    "preprocess",
    "read_stats",
    "reference_stats",
    "resize_tf_bilinear",
    "save_stats",
    "score",
    "state_dict_from_torchscript",
]
