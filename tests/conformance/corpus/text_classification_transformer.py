"""keras.io "Text classification with Transformer": token and position
embeddings, one Transformer block, pooling, softmax; Adam.

Changes: 200 -> 20 words, maxlen 200 -> 10, embed_dim 32 -> 8, 2 heads of
8 -> 2 heads of 4, ff_dim 32 -> 8, dropout rates 0.1 -> 0, epochs 2,
random ids for the IMDB reviews.
"""

import keras
import numpy as np
from keras import layers, ops

SOURCE = "https://keras.io/examples/nlp/text_classification_with_transformer/"
VOCAB_SIZE, MAXLEN = 20, 10
FIT = dict(epochs=2)


class TransformerBlock(layers.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.0):
        super().__init__()
        self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential([layers.Dense(ff_dim, activation="relu"),
                                     layers.Dense(embed_dim)])
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = layers.Dropout(rate)
        self.dropout2 = layers.Dropout(rate)

    def call(self, inputs):
        attn_output = self.dropout1(self.att(inputs, inputs))
        out1 = self.layernorm1(inputs + attn_output)
        ffn_output = self.dropout2(self.ffn(out1))
        return self.layernorm2(out1 + ffn_output)


class TokenAndPositionEmbedding(layers.Layer):
    def __init__(self, maxlen, vocab_size, embed_dim):
        super().__init__()
        self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        maxlen = ops.shape(x)[-1]
        positions = ops.arange(start=0, stop=maxlen, step=1)
        return self.token_emb(x) + self.pos_emb(positions)


def build():
    keras.utils.set_random_seed(11)
    embed_dim, num_heads, ff_dim = 8, 2, 8
    inputs = layers.Input(shape=(MAXLEN,))
    x = TokenAndPositionEmbedding(MAXLEN, VOCAB_SIZE, embed_dim)(inputs)
    x = TransformerBlock(embed_dim, num_heads, ff_dim)(x)
    x = layers.GlobalAveragePooling1D()(x)
    x = layers.Dropout(0.0)(x)
    x = layers.Dense(8, activation="relu")(x)
    outputs = layers.Dense(2, activation="softmax")(layers.Dropout(0.0)(x))
    model = keras.Model(inputs=inputs, outputs=outputs)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def data(examples):
    rng = np.random.RandomState(0)
    x = rng.randint(0, VOCAB_SIZE, size=(examples, MAXLEN))
    return x, (x[:, 0] > x[:, -1]).astype("int64")
