"""TensorFlow's "Parameter server training with ParameterServerStrategy"
tutorial, adopted with tfdist (tensorflow/docs,
site/en/tutorials/distribute/parameter_server_training.ipynb): training
with ``Model.fit``, the custom training loop with ``ClusterCoordinator``,
inline and scheduled evaluation.

The chief program of a ``tfdist-run --num_workers=1 --num_ps=2`` cluster
(tests/scenarios/tutorials/test_parameter_server_tutorial.py); its functions also build the one-device
reference there. The tutorial's code, with each change marked:

- ``# tfdist:`` ``tfdist.make_strategy("parameter_server")`` for the
  in-process cluster and ``ParameterServerStrategy(cluster_resolver,
  variable_partitioner=MinSizePartitioner(256 KiB, NUM_PS))`` (tfdist's
  defaults are that partitioner); ``tfdist.attach`` for ``Model.fit``;
  `tfdist.loops.parameter_server_loop.ParameterServerLoop` for the
  coordinator, ``create_per_worker_dataset`` and ``step_fn`` (the replica
  function gets a `tfdist.Batch`); ``loop.evaluate`` (each evaluation
  example once) for the scheduled evaluation over a repeated dataset;
  `tfdist.strategies.sharded.gradients` for ``tape.gradient`` (Keras 3's tape
  can not differentiate with respect to a sharded embedding table).
- ``# Keras 3:`` ``tf.keras.optimizers.legacy`` does not exist in Keras 3
  (instantiating one raises ImportError); ``ModelCheckpoint`` needs a
  ``.keras`` path; TensorFlow ops can not take Keras tensors
  (``keras.ops.mean`` for ``tf.reduce_mean``); a Keras 3 functional model
  checks the input rank, so the preprocessing models run on batches (the
  pipeline batches before its ``map``); a sharded variable is one Keras
  variable (``sharded.shards`` for ``emb_layer.weights[0]`` / ``[1]``);
  ``reset_state()``; optimizers built under the scope before scheduling.
- ``# test:`` seeded data and shuffles, so that one device sees the same.

Writes ``<output_dir>/chief.json``.
"""

import argparse
import json
import os
import pathlib
import random
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import tfdist  # noqa: E402

SEED = 1
FIT_EPOCHS, FIT_STEPS = 5, 20  # the tutorial's
NUM_EPOCHS, STEPS_PER_EPOCH = 4, 5  # the tutorial's
FEATURE_VOCAB = [
    "avenger", "ironman", "batman", "hulk", "spiderman", "kingkong", "wonder_woman"
]
LABEL_VOCAB = ["yes", "no"]


# -- Training with Model.fit ----------------------------------------------------------


def fit_dataset():
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    global_batch_size = 64

    x = tf.random.stateless_uniform((10, 10), seed=[1, 2])  # test: was tf.random.uniform
    # Keras 3: (10, 1) for (10,): Keras 2 expanded each batch's targets to
    # (64, 1) against the (64, 10) output; Keras 3's mse refuses (64,).
    y = tf.random.stateless_uniform((10, 1), seed=[3, 4])

    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(10, seed=SEED).repeat()
    dataset = dataset.batch(global_batch_size)
    dataset = dataset.prefetch(2)
    return dataset


def build_fit_model():
    """Call under the strategy's scope (as the tutorial does)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    model = tf.keras.models.Sequential([tf.keras.layers.Dense(10)])
    model.build((None, 10))  # Keras 3: BackupAndRestore refuses an unbuilt model
    # Keras 3: was tf.keras.optimizers.legacy.SGD()
    model.compile(tf.keras.optimizers.SGD(), loss="mse", steps_per_execution=10)
    return model


def fit_callbacks(working_dir):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    log_dir = os.path.join(working_dir, "log")
    ckpt_filepath = os.path.join(working_dir, "ckpt.keras")  # Keras 3: was "ckpt"
    backup_dir = os.path.join(working_dir, "backup")

    return [
        tf.keras.callbacks.TensorBoard(log_dir=log_dir),
        tf.keras.callbacks.ModelCheckpoint(filepath=ckpt_filepath),
        tf.keras.callbacks.BackupAndRestore(backup_dir=backup_dir),
    ]


def keras_alone(strategy):
    """Plain Keras ``fit`` under the strategy: its error, or None."""
    import keras  # pylint: disable=import-outside-toplevel

    keras.utils.set_random_seed(SEED)
    with strategy.scope():
        model = build_fit_model()
    try:
        model.fit(fit_dataset(), epochs=1, steps_per_epoch=FIT_STEPS, verbose=0)
    except Exception as error:  # pylint: disable=broad-except
        return f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300]}"
    return None


def fit_part(strategy, working_dir):
    import keras  # pylint: disable=import-outside-toplevel

    keras.utils.set_random_seed(SEED)
    dataset = fit_dataset()
    with strategy.scope():
        model = build_fit_model()
    tfdist.attach(model, strategy)  # tfdist: the one added line
    history = model.fit(dataset, epochs=FIT_EPOCHS, steps_per_epoch=FIT_STEPS,
                        callbacks=fit_callbacks(working_dir))
    return {"history": history.history, "weights": [w.tolist() for w in model.get_weights()]}


# -- Training with a custom training loop ------------------------------------------


def build_preprocessing():
    """The lookup layers and preprocessing models (under the scope: their
    tables are then copied to every worker)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    feature_lookup_layer = tf.keras.layers.StringLookup(
        vocabulary=FEATURE_VOCAB,
        mask_token=None)
    label_lookup_layer = tf.keras.layers.StringLookup(
        vocabulary=LABEL_VOCAB,
        num_oov_indices=0,
        mask_token=None)

    raw_feature_input = tf.keras.layers.Input(
        shape=(3,),
        dtype=tf.string,
        name="feature")
    feature_id_input = feature_lookup_layer(raw_feature_input)
    feature_preprocess_stage = tf.keras.Model(
        {"features": raw_feature_input},
        feature_id_input)

    raw_label_input = tf.keras.layers.Input(
        shape=(1,),
        dtype=tf.string,
        name="label")
    label_id_input = label_lookup_layer(raw_label_input)

    label_preprocess_stage = tf.keras.Model(
        {"label": raw_label_input},
        label_id_input)
    return feature_lookup_layer, feature_preprocess_stage, label_preprocess_stage


def feature_and_label_gen(num_examples=200, seed=0):
    rng = random.Random(seed)  # test: was the module `random`
    examples = {"features": [], "label": []}
    for _ in range(num_examples):
        features = rng.sample(FEATURE_VOCAB, 3)
        label = ["yes"] if "avenger" in features else ["no"]
        examples["features"].append(features)
        examples["label"].append(label)
    return examples


def make_preprocess(feature_preprocess_stage, label_preprocess_stage):
    def preprocess(x):
        return ({"features": feature_preprocess_stage(x["features"])},
                label_preprocess_stage(x["label"]))

    return preprocess


def make_dataset_fn(examples, feature_preprocess_stage, label_preprocess_stage):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    preprocess = make_preprocess(feature_preprocess_stage, label_preprocess_stage)

    def dataset_fn(_):
        raw_dataset = tf.data.Dataset.from_tensor_slices(examples)

        # Keras 3: batched before the map (the tutorial: map, shuffle, batch);
        # test: a seeded shuffle.
        train_dataset = raw_dataset.shuffle(200, seed=SEED).batch(32).map(
            preprocess).repeat()
        return train_dataset

    return dataset_fn


def build_model(feature_lookup_layer):
    """The embedding model (under the scope: its variables on the ps tasks)."""
    import keras  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    # Create the model. The input needs to be compatible with Keras processing layers.
    model_input = tf.keras.layers.Input(
        shape=(3,), dtype=tf.int64, name="model_input")

    emb_layer = tf.keras.layers.Embedding(
        input_dim=len(feature_lookup_layer.get_vocabulary()), output_dim=16384)
    emb_output = keras.ops.mean(emb_layer(model_input), axis=1)  # Keras 3: was tf.reduce_mean
    dense_output = tf.keras.layers.Dense(
        units=1, activation="sigmoid",
        kernel_regularizer=tf.keras.regularizers.L2(1e-4),
    )(emb_output)
    model = tf.keras.Model({"features": model_input}, dense_output)
    return model, emb_layer


def make_eval_examples():
    return feature_and_label_gen(num_examples=16, seed=1)  # test: drawn once, seeded


def full_weights(model):
    """Every weight as one array (a sharded table's shards joined)."""
    pieces = tfdist.strategies.sharded.shards
    return [np.concatenate([np.asarray(p.numpy()) for p in pieces(w)], axis=0)
            for w in model.weights]


def custom_loop(strategy):
    import keras  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    result = {}
    keras.utils.set_random_seed(SEED)
    with strategy.scope():
        feature_lookup_layer, feature_preprocess_stage, label_preprocess_stage = (
            build_preprocessing())
    examples = feature_and_label_gen()

    # These variables created under the `Strategy.scope` will be placed on parameter
    # servers in a round-robin fashion.
    with strategy.scope():
        model, emb_layer = build_model(feature_lookup_layer)
        optimizer = tf.keras.optimizers.RMSprop(learning_rate=0.1)  # Keras 3: was legacy
        accuracy = tf.keras.metrics.Accuracy()
        optimizer.build(model.trainable_variables)  # Keras 3: on the ps before scheduling

    # Keras 3: was emb_layer.weights[0] / [1] (one Keras variable, two shards)
    shards = tfdist.strategies.sharded.shards(emb_layer.embeddings)
    result["embedding_shards"] = [[v.device, list(v.shape)] for v in shards]

    def replica_fn(batch):  # tfdist: a tfdist.Batch (was replica_fn(batch_data, labels))
        batch_data, labels = batch.x, batch.y  # tfdist
        with tf.GradientTape() as tape:
            pred = model(batch_data, training=True)
            per_example_loss = tf.keras.losses.BinaryCrossentropy(
                reduction=tf.keras.losses.Reduction.NONE)(labels, pred)
            loss = tf.nn.compute_average_loss(per_example_loss)
            model_losses = model.losses
            if model_losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))
        # tfdist: was tape.gradient(loss, model.trainable_variables)
        gradients = tfdist.strategies.sharded.gradients(tape, loss, model.trainable_variables)

        optimizer.apply_gradients(zip(gradients, model.trainable_variables))

        actual_pred = tf.cast(tf.greater(pred, 0.5), tf.int64)
        accuracy.update_state(labels, actual_pred)
        return loss

    dataset_fn = make_dataset_fn(examples, feature_preprocess_stage, label_preprocess_stage)
    # tfdist: replaces ClusterCoordinator(strategy), per_worker_dataset_fn,
    # create_per_worker_dataset, iter(...) and step_fn's strategy.run + reduce.
    loop = tfdist.loops.parameter_server_loop.ParameterServerLoop(strategy, dataset_fn, replica_fn)

    num_epochs = NUM_EPOCHS
    steps_per_epoch = STEPS_PER_EPOCH
    result["accuracy"] = []
    for i in range(num_epochs):
        accuracy.reset_state()  # Keras 3: was reset_states()
        for _ in range(steps_per_epoch):
            loop.schedule()  # tfdist: was coordinator.schedule(step_fn, args=(per_worker_iterator,))
        # Wait at epoch boundaries.
        loop.join()  # tfdist: was coordinator.join()
        print("Finished epoch %d, accuracy is %f." % (i, accuracy.result().numpy()), flush=True)
        result["accuracy"].append(float(accuracy.result()))

    loss = loop.schedule()  # tfdist
    print("Final loss is %f" % loss.fetch(), flush=True)
    result["final_loss"] = float(loss.fetch())
    result["weights"] = [w.tolist() for w in full_weights(model)]
    result["iterations"] = int(optimizer.iterations.numpy())  # test

    # -- Inline evaluation (on the coordinator): unchanged ------------------------
    eval_examples = make_eval_examples()
    preprocess = make_preprocess(feature_preprocess_stage, label_preprocess_stage)
    eval_dataset = tf.data.Dataset.from_tensor_slices(eval_examples).batch(8).map(
        preprocess)  # Keras 3: batched before the map

    eval_accuracy = tf.keras.metrics.Accuracy()

    for batch_data, labels in eval_dataset:
        pred = model(batch_data, training=False)
        actual_pred = tf.cast(tf.greater(pred, 0.5), tf.int64)
        eval_accuracy.update_state(labels, actual_pred)

    print("Evaluation accuracy: %f" % eval_accuracy.result(), flush=True)
    result["inline_eval_accuracy"] = float(eval_accuracy.result())

    # -- Scheduled evaluation, each example once -------------------------------------
    with strategy.scope():
        # Define the eval metric on parameter servers.
        eval_accuracy = tf.keras.metrics.Accuracy()
        eval_examples_seen = tf.keras.metrics.Sum()  # test: each example once?

    def eval_replica_fn(batch):  # tfdist: a tfdist.Batch (was eval_step's replica_fn)
        pred = model(batch.x, training=False)
        actual_pred = tf.cast(tf.greater(pred, 0.5), tf.int64)
        eval_accuracy.update_state(batch.y, actual_pred)
        eval_examples_seen.update_state(tf.cast(tf.shape(batch.y)[0], tf.float32))  # test

    def eval_dataset_fn(input_context):
        # tfdist: sharded by its InputContext, and no shuffle(16).repeat(): the
        # shards together hold each example once.
        return tf.data.Dataset.from_tensor_slices(eval_examples).shard(
            input_context.num_input_pipelines, input_context.input_pipeline_id).batch(8).map(
                preprocess)

    # tfdist: was create_per_worker_dataset(eval_dataset_fn), then
    # eval_steps_per_epoch x coordinator.schedule(eval_step, ...), coordinator.join()
    loop.evaluate(eval_dataset_fn, eval_replica_fn)
    print("Evaluation accuracy: %f" % eval_accuracy.result(), flush=True)
    result["scheduled_eval_accuracy"] = float(eval_accuracy.result())
    result["scheduled_eval_examples"] = float(eval_examples_seen.result())  # test
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", required=True)
    args = parser.parse_args()

    # tfdist: was create_in_process_cluster(NUM_WORKERS, NUM_PS) and
    # tf.distribute.ParameterServerStrategy(cluster_resolver,
    #     variable_partitioner=MinSizePartitioner(min_shard_bytes=256 << 10, max_shards=NUM_PS))
    strategy = tfdist.make_strategy("parameter_server")

    results = {"keras_error": keras_alone(strategy),
               "fit": fit_part(strategy, os.path.join(args.output_dir, "my_working_dir")),
               "ctl": custom_loop(strategy)}
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, "chief.json"), "w", encoding="utf-8") as out:
        json.dump(results, out)


if __name__ == "__main__":
    main()
