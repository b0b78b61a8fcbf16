"""scikit-learn models converted by skl2onnx (issue 31, item 4): every `ai.onnx.ml` operator
deepx_flow converts, in the pipelines skl2onnx writes for it, gives ONNX Runtime's outputs:
labels equal, scores within 1e-5 of ONNX Runtime's largest. The data are scikit-learn's
bundled datasets (no download), with missing values where an imputer needs them."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
skl2onnx = pytest.importorskip("skl2onnx")

from onnx import TensorProto, helper  # noqa: E402
from sklearn import datasets  # noqa: E402
from sklearn.ensemble import (GradientBoostingClassifier, GradientBoostingRegressor,  # noqa: E402
                              RandomForestClassifier, RandomForestRegressor)
from sklearn.impute import SimpleImputer  # noqa: E402
from sklearn.linear_model import LinearRegression, LogisticRegression  # noqa: E402
from sklearn.neural_network import MLPClassifier  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import (Binarizer, Normalizer, OneHotEncoder,  # noqa: E402
                                   StandardScaler)
from sklearn.svm import SVC, SVR  # noqa: E402

import deepx_flow as dx  # noqa: E402
from deepx_flow.errors import SpecError  # noqa: E402


def _data(name):
    loader = {"iris": datasets.load_iris, "cancer": datasets.load_breast_cancer,
              "diabetes": datasets.load_diabetes}[name]
    x, y = loader(return_X_y=True)
    return x.astype(np.float32), y


def _with_gaps(x):
    x = x.copy()
    x[::7, 1] = np.nan
    x[3::11, 0] = np.nan
    return x


def _categories():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 5, (120, 3)).astype(np.int64)
    return x, (x[:, 0] + x[:, 2]) % 3


PIPELINES = {
    "scaler_logistic": lambda: (make_pipeline(StandardScaler(), LogisticRegression(
        max_iter=500)), *_data("iris")),
    "binary_logistic": lambda: (make_pipeline(StandardScaler(), LogisticRegression(
        max_iter=500)), *_data("cancer")),
    "mlp": lambda: (MLPClassifier(hidden_layer_sizes=(16,), max_iter=400, random_state=0),
                    *_data("iris")),
    "random_forest": lambda: (RandomForestClassifier(n_estimators=12, random_state=0),
                              *_data("iris")),
    "random_forest_binary": lambda: (RandomForestClassifier(
        n_estimators=8, max_depth=6, random_state=0), *_data("cancer")),
    "forest_regressor": lambda: (RandomForestRegressor(n_estimators=8, random_state=0),
                                 *_data("diabetes")),
    "boosting_binary": lambda: (GradientBoostingClassifier(n_estimators=10, random_state=0),
                                *_data("cancer")),
    "boosting_regressor": lambda: (GradientBoostingRegressor(n_estimators=10, random_state=0),
                                   *_data("diabetes")),
    "imputer_normalizer_binarizer": lambda: (make_pipeline(
        SimpleImputer(), Normalizer(), Binarizer(threshold=0.1), LogisticRegression()),
        _with_gaps(_data("iris")[0]), _data("iris")[1]),
    "one_hot": lambda: (make_pipeline(OneHotEncoder(), LogisticRegression()), *_categories()),
    "linear_regression": lambda: (LinearRegression(), *_data("diabetes")),
    "svc_linear": lambda: (make_pipeline(StandardScaler(), SVC(kernel="linear")),
                           *_data("iris")),
    "svc_rbf": lambda: (make_pipeline(StandardScaler(), SVC(kernel="rbf")), *_data("cancer")),
    "svr_linear": lambda: (SVR(kernel="linear"), *_data("diabetes")),
}


def _convert(model, x):
    last = model.steps[-1][1] if hasattr(model, "steps") else model
    options = {id(last): {"zipmap": False}} if hasattr(last, "classes_") else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return skl2onnx.to_onnx(model, x[:1], options=options)


def _compare(path, x, client):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = session.run(None, {session.get_inputs()[0].name: x})
    model = dx.onnx.load(path)
    outs = model({model.input_names[0]: dx.input("x", x.shape, x.dtype.name)})
    got = dx.run([outs[n] for n in model.output_names], inputs={"x": x}, client=client)
    for name, g, w in zip(model.output_names, got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        if w.dtype.kind in "iu":
            np.testing.assert_array_equal(g, w, err_msg=name)
        else:
            scale = np.nanmax(np.abs(w)) if np.isfinite(w).any() else 0.0  # NaN where 0/0
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * scale, err_msg=name)
    return {op for op in model.ops}


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_a_converted_pipeline_gives_onnx_runtimes_outputs(client, tmp_path, name):
    model, x, y = PIPELINES[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence warnings of the small fits
        model.fit(x, y)
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(_convert(model, x).SerializeToString())
    _compare(path, x, client)


def test_every_ml_operator_is_among_the_pipelines_or_built_here(client, tmp_path):
    """The ai.onnx.ml operators of `SUPPORTED` are all exercised: by the pipelines above,
    by models built here with onnx.helper (LabelEncoder, Scaler with its own offsets), or
    (TreeEnsemble of opset 5) by ONNX's node tests in test_onnx_backend.py, against ONNX
    Runtime or ONNX's expected outputs."""
    from deepx_flow.onnx.converters import SUPPORTED
    seen = set()
    for name, make in PIPELINES.items():
        model, x, y = make()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.fit(x, y)
        seen |= {f"{n.domain}.{n.op_type}" for n in _convert(model, x).graph.node
                 if n.domain == "ai.onnx.ml"}
    built = {"ai.onnx.ml.LabelEncoder", "ai.onnx.ml.Scaler", "ai.onnx.ml.TreeEnsemble"}
    wanted = {k for k in SUPPORTED if k.startswith("ai.onnx.ml.")}
    assert wanted <= seen | built, wanted - seen - built


def _ml_model(path, node, x_type, y_types, opsets=(("ai.onnx.ml", 3),)):
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", x_type, ["N", 3])],
        [helper.make_tensor_value_info(name, t, ["N", 3]) for name, t in y_types])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in
                                                    (("", 17),) + tuple(opsets)])
    onnx.save(model, str(path))
    return str(path)


def test_label_encoders_and_a_scaler_built_by_hand(client, tmp_path):
    rng = np.random.default_rng(1)
    ints = rng.integers(-3, 9, (40, 3)).astype(np.int64)
    floats = rng.choice(np.array([0.5, 1.5, np.nan, 2.25, -1.0], np.float32), (40, 3))
    cases = [
        (helper.make_node("LabelEncoder", ["x"], ["y"], domain="ai.onnx.ml",
                          keys_int64s=[0, 2, 5, 7], values_floats=[1.5, -2.0, 3.25, 0.0],
                          default_float=9.0), TensorProto.INT64, TensorProto.FLOAT, ints),
        (helper.make_node("LabelEncoder", ["x"], ["y"], domain="ai.onnx.ml",
                          keys_floats=[0.5, 2.25, float("nan")], values_int64s=[4, 5, 6],
                          default_int64=-7), TensorProto.FLOAT, TensorProto.INT64, floats),
        (helper.make_node("Scaler", ["x"], ["y"], domain="ai.onnx.ml",
                          offset=[1.0, -2.0, 0.5], scale=[2.0, 0.25, -1.0]),
         TensorProto.INT64, TensorProto.FLOAT, ints),
    ]
    for k, (node, x_type, y_type, x) in enumerate(cases):
        path = _ml_model(tmp_path / f"m{k}.onnx", node, x_type, [("y", y_type)])
        _compare(path, x, client)
    # ai.onnx.ml opset 4: keys and values as tensors, and keys compare bit for bit, so a
    # NaN key matches NaN (at opset 3 it matched nothing)
    tensor = onnx.numpy_helper.from_array
    node = helper.make_node(
        "LabelEncoder", ["x"], ["y"], domain="ai.onnx.ml",
        keys_tensor=tensor(np.array([0.5, 2.25, np.nan], np.float32)),
        values_tensor=tensor(np.array([4, 5, 6], np.int64)),
        default_tensor=tensor(np.array([-7], np.int64)))
    path = _ml_model(tmp_path / "v4.onnx", node, TensorProto.FLOAT, [("y", TensorProto.INT64)],
                     opsets=(("ai.onnx.ml", 4),))
    _compare(path, floats, client)


def test_zipmap_is_refused_with_the_advice_to_convert_without_it(tmp_path):
    x, y = _data("iris")
    model = LogisticRegression(max_iter=500).fit(x, y)
    path = tmp_path / "zipmap.onnx"
    path.write_bytes(skl2onnx.to_onnx(model, x[:1]).SerializeToString())  # zipmap on
    with pytest.raises(SpecError, match=r"\(ZipMap\): ZipMap makes a sequence of maps.*"
                                        r"options=\{'zipmap': False\}"):
        dx.onnx.load(path)


def test_string_labels_and_probability_estimates_are_refused_by_name(tmp_path):
    x, y = _data("iris")
    named = np.array(["setosa", "versicolor", "virginica"])[y]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = LogisticRegression(max_iter=500).fit(x, named)
    path = tmp_path / "strings.onnx"
    path.write_bytes(_convert(model, x).SerializeToString())
    with pytest.raises(SpecError, match="(LinearClassifier).*strings|STRING"):
        dx.onnx.load(path)(X=dx.input("x", x.shape, "float32"))
    svc = make_pipeline(StandardScaler(), SVC(probability=True, random_state=0)).fit(x, y)
    path = tmp_path / "proba.onnx"
    path.write_bytes(_convert(svc, x).SerializeToString())
    with pytest.raises(SpecError, match=r"\(SVMClassifier\): probability estimates"):
        dx.onnx.load(path)(X=dx.input("x", x.shape, "float32"))


# -- binary classifiers and post-transforms, built by hand (what skl2onnx writes only some of)
POSTS = ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"]


def _classifier_model(path, node, features):
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", features])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, ["N"]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("ai.onnx.ml", 3)])
    onnx.save(model, str(path))
    return str(path)


@pytest.mark.parametrize("post", POSTS)
@pytest.mark.parametrize("weights", [[0.3, 0.8], [-0.4, 0.6], [0.3, 0.45]])
@pytest.mark.parametrize("mode", ["BRANCH_LEQ", "BRANCH_NEQ"])
def test_a_binary_tree_ensemble_scoring_one_class(client, tmp_path, post, weights, mode):
    """Weights all positive: the score is a probability (label above 0.5, scores (1 - p,
    p)); of both signs: a margin (label above 0, scores (-s, s)); labels from the raw score;
    NaN compares (false, but true for BRANCH_NEQ) where no missing-value track is given."""
    node = helper.make_node(
        "TreeEnsembleClassifier", ["x"], ["label", "scores"], domain="ai.onnx.ml",
        nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
        nodes_values=[0.0, 0.0, 0.0], nodes_modes=[mode, "LEAF", "LEAF"],
        nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0], class_treeids=[0, 0],
        class_nodeids=[1, 2], class_ids=[0, 0], class_weights=weights,
        classlabels_int64s=[4, 7], post_transform=post)
    x = np.array([[-1.0], [1.0], [0.0], [np.nan]], np.float32)
    _compare(_classifier_model(tmp_path / "tree.onnx", node, 1), x, client)


@pytest.mark.parametrize("post", POSTS)
@pytest.mark.parametrize("rows", [1, 3])
def test_linear_classifiers_label_from_raw_scores(client, tmp_path, post, rows):
    """One row of coefficients (binary: label above 0, scores (1 - s, s), or (1 - p, p)
    under LOGISTIC) and three (labels of the highest raw score: saturated sigmoids tie)."""
    coefficients = [1.0] if rows == 1 else [1.0, 2.0, -1.0]
    node = helper.make_node(
        "LinearClassifier", ["x"], ["label", "scores"], domain="ai.onnx.ml",
        coefficients=coefficients, intercepts=[0.0] * rows,
        classlabels_ints=[4, 7] if rows == 1 else [4, 7, 9], post_transform=post)
    x = np.array([[-2.0], [-0.3], [0.0], [0.2], [0.6], [20.0], [25.0]], np.float32)
    _compare(_classifier_model(tmp_path / "linear.onnx", node, 1), x, client)


@pytest.mark.parametrize("post", POSTS)
@pytest.mark.parametrize("classes,signs", [(2, "positive"), (2, "mixed"), (3, "mixed")])
def test_svm_classifiers_vote_and_score_as_onnx_runtime(client, tmp_path, post, classes,
                                                        signs):
    rng = np.random.default_rng(classes)
    per_class = [2] * classes
    count = sum(per_class)
    coefficients = np.abs(rng.standard_normal((classes - 1) * count))
    if signs == "mixed":
        coefficients *= np.sign(rng.standard_normal(coefficients.size))
    node = helper.make_node(
        "SVMClassifier", ["x"], ["label", "scores"], domain="ai.onnx.ml",
        classlabels_ints=list(range(3, 3 + classes)), coefficients=coefficients.tolist(),
        kernel_type="RBF", kernel_params=[0.5, 0.0, 3.0], post_transform=post,
        rho=rng.standard_normal(classes * (classes - 1) // 2).tolist(),
        support_vectors=rng.standard_normal(count * 2).tolist(), vectors_per_class=per_class)
    x = rng.standard_normal((8, 2)).astype(np.float32)
    _compare(_classifier_model(tmp_path / "svm.onnx", node, 2), x, client)


def test_a_boosted_classifier_with_raw_scores(client, tmp_path):
    """skl2onnx's raw_scores: the margins of a binary gradient boosting (mixed weights, no
    post-transform): labels above 0, scores (-s, s)."""
    x, y = _data("cancer")
    model = GradientBoostingClassifier(n_estimators=10, random_state=0).fit(x, y)
    onx = skl2onnx.to_onnx(model, x[:1], options={id(model): {"zipmap": False,
                                                              "raw_scores": True}})
    path = tmp_path / "raw.onnx"
    path.write_bytes(onx.SerializeToString())
    _compare(path, x, client)


def test_a_scaler_computes_in_its_inputs_type(client, tmp_path):
    """(1e6 + 0.3 - 1e6) * 1 in float64, rounded once to float32: 0.3, not 0.3125."""
    node = helper.make_node("Scaler", ["x"], ["y"], domain="ai.onnx.ml",
                            offset=[1e6, 0.0, 0.0], scale=[1.0, 2.0, 3.0])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("ai.onnx.ml", 3)]),
              str(tmp_path / "scaler.onnx"))
    x = np.array([[1e6 + 0.3, 1.5, -2.0], [1e6 - 7.25, 0.1, 3.0]])
    _compare(tmp_path / "scaler.onnx", x, client)


def test_a_classifiers_probit_is_refused(tmp_path):
    node = helper.make_node("LinearClassifier", ["x"], ["label", "scores"],
                            domain="ai.onnx.ml", coefficients=[1.0, 2.0], intercepts=[0.0, 0.0],
                            classlabels_ints=[0, 1], post_transform="PROBIT")
    model = dx.onnx.load(_classifier_model(tmp_path / "probit.onnx", node, 1))
    with pytest.raises(SpecError, match="PROBIT of a classifier is not supported"):
        model(x=dx.input("x", (4, 1), "float32"))
