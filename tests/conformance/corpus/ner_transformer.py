"""keras.io "Named Entity Recognition using Transformers": a Transformer
token classifier, a per-token softmax, and the example's own loss that
leaves padding tokens out and returns their mean (a scalar); Adam.

Changes: vocabulary 20000 -> 30 ids, 10 tags -> 4, embed_dim 32 -> 8,
ff_dim 64 -> 8, dropout 0.1 -> 0, sentences of 2..10 tokens padded with 0
to 10, random tags for CoNLL 2003, epochs 2.

tfdist warns: the loss returns a scalar, the mean over the non-padding
tokens of the whole batch, which per replica is a ratio of its own sums;
weighted by examples, the replicas' ratios are not the batch's ratio.
"""

import keras
import numpy as np
from keras import layers, ops

from conformance.corpus.text_classification_transformer import (
    TokenAndPositionEmbedding, TransformerBlock)

SOURCE = "https://keras.io/examples/nlp/ner_transformers/"
VOCAB_SIZE, MAXLEN, NUM_TAGS = 30, 10, 4
FIT = dict(epochs=2)
WARNS = r"'custom_non_padding_token_loss' returns a scalar"
EXACT = False  # (the warning says why)


class NERModel(keras.Model):
    def __init__(self, num_tags, vocab_size, maxlen=128, embed_dim=32, num_heads=2, ff_dim=32):
        super().__init__()
        self.embedding_layer = TokenAndPositionEmbedding(maxlen, vocab_size, embed_dim)
        self.transformer_block = TransformerBlock(embed_dim, num_heads, ff_dim)
        self.dropout1 = layers.Dropout(0.0)
        self.ff = layers.Dense(ff_dim, activation="relu")
        self.dropout2 = layers.Dropout(0.0)
        self.ff_final = layers.Dense(num_tags, activation="softmax")

    def call(self, inputs, training=False):
        x = self.embedding_layer(inputs)
        x = self.transformer_block(x)
        x = self.dropout1(x, training=training)
        x = self.ff(x)
        x = self.dropout2(x, training=training)
        return self.ff_final(x)


class CustomNonPaddingTokenLoss(keras.losses.Loss):
    def __init__(self, name="custom_non_padding_token_loss"):
        super().__init__(name=name)

    def call(self, y_true, y_pred):
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=False, reduction=None)
        loss = loss_fn(y_true, y_pred)
        mask = ops.cast((y_true > 0), dtype="float32")
        loss = loss * mask
        return ops.sum(loss) / ops.sum(mask)


def build():
    keras.utils.set_random_seed(12)
    model = NERModel(NUM_TAGS, VOCAB_SIZE, maxlen=MAXLEN, embed_dim=8, num_heads=2, ff_dim=8)
    model.build((None, MAXLEN))
    model.compile(optimizer="adam", loss=CustomNonPaddingTokenLoss())
    return model


def data(examples):
    rng = np.random.RandomState(1)
    x = np.zeros((examples, MAXLEN), "int64")
    for row, length in enumerate(rng.randint(2, MAXLEN + 1, size=examples)):
        x[row, :length] = rng.randint(1, VOCAB_SIZE, size=length)
    tags = np.where(x > 0, 1 + x % (NUM_TAGS - 1), 0)
    return x, tags
