"""SAM's prompt encoder and mask decoder (shared by every SAM variant; MobileSAM keeps them as is).

Prompt encoder: points and box corners become random-Fourier positional encodings plus a learned
embedding per kind; a low-res mask prompt goes through a small strided conv stack. Mask decoder:
a two-way transformer between the prompt tokens (plus an IoU token and four mask tokens) and the
image embedding, transposed-conv upscaling ×4, and per-token hypernetwork MLPs giving the mask
logits. NHWC for feature maps; masks come out as (B, num_masks, H, W) planes as in SAM.
"""
from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn

from mlxnet import ops
from mlxnet.nn import GELU, Conv2d, ConvTranspose2d, LayerNorm, compiled_for_inference

# An attention block's projections of the image tokens: (keys, values) of the token→image
# attention and the queries of the image→token one, each split into heads.
ImageSide = tuple[tuple[mx.array, mx.array], mx.array]


class PositionEmbeddingRandom(nn.Module):
    """Positional encoding with random spatial frequencies (a fixed buffer in the checkpoint)."""

    # Drawn once and stored beside the learned weights, never learned: random initialisation
    # keeps it (zeroing or re-scaling it makes every position encode alike).
    fixed_parameters = ("positional_encoding_gaussian_matrix",)

    def __init__(self, num_pos_feats: int = 64) -> None:
        super().__init__()
        self.positional_encoding_gaussian_matrix = mx.random.normal((2, num_pos_feats), key=mx.random.key(0))

    def _pe_encoding(self, coords: mx.array) -> mx.array:
        """coords (..., 2) normalised to [0, 1] → (..., 2 * num_pos_feats), computed in float32 and
        returned in the model's dtype."""
        gauss = self.positional_encoding_gaussian_matrix
        coords = (2 * coords.astype(mx.float32) - 1) @ gauss.astype(mx.float32)
        coords = (2 * math.pi) * coords
        return mx.concatenate([mx.sin(coords), mx.cos(coords)], axis=-1).astype(gauss.dtype)

    def __call__(self, size: tuple[int, int]) -> mx.array:
        """(H, W, C) encoding of the pixel centres of an H×W grid."""
        h, w = size
        y = (mx.arange(h, dtype=mx.float32) + 0.5) / h
        x = (mx.arange(w, dtype=mx.float32) + 0.5) / w
        grid = mx.stack([mx.broadcast_to(x[None, :], (h, w)), mx.broadcast_to(y[:, None], (h, w))], axis=-1)
        return self._pe_encoding(grid)

    def forward_with_coords(self, coords: mx.array, image_size: tuple[int, int]) -> mx.array:
        """Encode (x, y) pixel coordinates of an image of size (H, W)."""
        scale = mx.array([image_size[1], image_size[0]], dtype=mx.float32)
        return self._pe_encoding(coords.astype(mx.float32) / scale)


class PromptEncoder(nn.Module):
    def __init__(self, embed_dim: int = 256, image_embedding_size: tuple[int, int] = (64, 64),
                 input_image_size: tuple[int, int] = (1024, 1024), mask_in_chans: int = 16) -> None:
        super().__init__()
        self.embed_dim = embed_dim
        self.input_image_size = input_image_size
        self.image_embedding_size = image_embedding_size
        self.pe_layer = PositionEmbeddingRandom(embed_dim // 2)
        # negative point, positive point, box top-left, box bottom-right
        self.point_embeddings = [nn.Embedding(1, embed_dim) for _ in range(4)]
        self.not_a_point_embed = nn.Embedding(1, embed_dim)
        self.mask_input_size = (4 * image_embedding_size[0], 4 * image_embedding_size[1])
        c = mask_in_chans
        self.mask_downscaling = [
            Conv2d(1, c // 4, 2, stride=2), LayerNorm(c // 4, eps=1e-6), GELU(),
            Conv2d(c // 4, c, 2, stride=2), LayerNorm(c, eps=1e-6), GELU(),
            Conv2d(c, embed_dim, 1),
        ]
        self.no_mask_embed = nn.Embedding(1, embed_dim)

    def get_dense_pe(self) -> mx.array:
        """(1, h, w, C) positional encoding of the image embedding's grid."""
        return self.pe_layer(self.image_embedding_size)[None]

    def _embed_points(self, points: mx.array, labels: mx.array, pad: bool) -> mx.array:
        points = points.astype(mx.float32) + 0.5  # pixel centres
        if pad:  # a "not a point" token stands in for the missing box
            b = points.shape[0]
            points = mx.concatenate([points, mx.zeros((b, 1, 2))], axis=1)
            labels = mx.concatenate([labels, -mx.ones((b, 1), labels.dtype)], axis=1)
        pe = self.pe_layer.forward_with_coords(points, self.input_image_size)
        lab = labels[..., None]
        pe = mx.where(lab == -1, self.not_a_point_embed.weight[0], pe)
        pe = mx.where(lab == 0, pe + self.point_embeddings[0].weight[0], pe)
        return mx.where(lab == 1, pe + self.point_embeddings[1].weight[0], pe)

    def _embed_boxes(self, boxes: mx.array) -> mx.array:
        corners = boxes.astype(mx.float32).reshape(-1, 2, 2) + 0.5
        pe = self.pe_layer.forward_with_coords(corners, self.input_image_size)
        corner = mx.stack([self.point_embeddings[2].weight[0], self.point_embeddings[3].weight[0]])
        return pe + corner

    def _embed_masks(self, masks: mx.array) -> mx.array:
        for layer in self.mask_downscaling:
            masks = layer(masks)
        return masks

    @compiled_for_inference
    def __call__(self, points: tuple[mx.array, mx.array] | None, boxes: mx.array | None,
                 masks: mx.array | None) -> tuple[mx.array, mx.array]:
        """points: ((B, N, 2) xy in the 1024 frame, (B, N) labels 1/0/-1); boxes (B, 4) xyxy;
        masks (B, 256, 256, 1) logits. Returns sparse (B, n, C) and dense (B, h, w, C) embeddings."""
        bs = next((t.shape[0] for t in (points[0] if points else None, boxes, masks) if t is not None), 1)
        sparse = [mx.zeros((bs, 0, self.embed_dim))]
        if points is not None:
            sparse.append(self._embed_points(points[0], points[1], pad=boxes is None))
        if boxes is not None:
            sparse.append(self._embed_boxes(boxes))
        sparse_embeddings = mx.concatenate(sparse, axis=1)
        if masks is not None:
            dense = self._embed_masks(masks)
        else:
            h, w = self.image_embedding_size
            dense = mx.broadcast_to(self.no_mask_embed.weight.reshape(1, 1, 1, -1), (bs, h, w, self.embed_dim))
        return sparse_embeddings, dense


class Attention(nn.Module):
    """Multi-head attention whose projections may shrink the width by ``downsample_rate``."""

    def __init__(self, embedding_dim: int, num_heads: int, downsample_rate: int = 1) -> None:
        super().__init__()
        internal = embedding_dim // downsample_rate
        self.num_heads = num_heads
        self.q_proj = nn.Linear(embedding_dim, internal)
        self.k_proj = nn.Linear(embedding_dim, internal)
        self.v_proj = nn.Linear(embedding_dim, internal)
        self.out_proj = nn.Linear(internal, embedding_dim)

    def _heads(self, x: mx.array) -> mx.array:
        b, n, c = x.shape
        return x.reshape(b, n, self.num_heads, c // self.num_heads).transpose(0, 2, 1, 3)

    def queries(self, q: mx.array) -> mx.array:
        return self._heads(self.q_proj(q))

    def keys_values(self, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
        return self._heads(self.k_proj(k)), self._heads(self.v_proj(v))

    def attend(self, q: mx.array, kv: tuple[mx.array, mx.array]) -> mx.array:
        """Attention of projected queries (B, heads, n, d) over projected keys and values."""
        out = ops.scaled_dot_product_attention(q, *kv, scale=q.shape[-1] ** -0.5)
        b, _, n, _ = out.shape
        return self.out_proj(out.transpose(0, 2, 1, 3).reshape(b, n, -1))

    def __call__(self, q: mx.array, k: mx.array, v: mx.array) -> mx.array:
        return self.attend(self.queries(q), self.keys_values(k, v))


class MLPBlock(nn.Module):
    def __init__(self, embedding_dim: int, mlp_dim: int) -> None:
        super().__init__()
        self.lin1 = nn.Linear(embedding_dim, mlp_dim)
        self.lin2 = nn.Linear(mlp_dim, embedding_dim)

    def __call__(self, x: mx.array) -> mx.array:
        return self.lin2(nn.relu(self.lin1(x)))


class TwoWayAttentionBlock(nn.Module):
    """Token self-attention, tokens→image cross-attention, token MLP, image→tokens cross-attention."""

    def __init__(self, embedding_dim: int, num_heads: int, mlp_dim: int, downsample_rate: int,
                 skip_first_layer_pe: bool) -> None:
        super().__init__()
        self.self_attn = Attention(embedding_dim, num_heads)
        self.norm1 = LayerNorm(embedding_dim)
        self.cross_attn_token_to_image = Attention(embedding_dim, num_heads, downsample_rate)
        self.norm2 = LayerNorm(embedding_dim)
        self.mlp = MLPBlock(embedding_dim, mlp_dim)
        self.norm3 = LayerNorm(embedding_dim)
        self.norm4 = LayerNorm(embedding_dim)
        self.cross_attn_image_to_token = Attention(embedding_dim, num_heads, downsample_rate)
        self.skip_first_layer_pe = skip_first_layer_pe

    def image_side(self, keys: mx.array, key_pe: mx.array) -> ImageSide:
        """The projections of the image tokens as the block reads them (before it updates them):
        keys and values of the token→image attention, queries of the image→token one."""
        k = keys + key_pe
        return self.cross_attn_token_to_image.keys_values(k, keys), self.cross_attn_image_to_token.queries(k)

    def __call__(self, queries: mx.array, keys: mx.array, query_pe: mx.array, key_pe: mx.array,
                 image_side: ImageSide | None = None) -> tuple[mx.array, mx.array]:
        """``image_side``: :meth:`image_side` of these keys, when already computed."""
        image_kv, image_q = self.image_side(keys, key_pe) if image_side is None else image_side
        if self.skip_first_layer_pe:
            queries = self.self_attn(queries, queries, queries)
        else:
            q = queries + query_pe
            queries = queries + self.self_attn(q, q, queries)
        queries = self.norm1(queries)
        q = self.cross_attn_token_to_image.queries(queries + query_pe)
        queries = self.norm2(queries + self.cross_attn_token_to_image.attend(q, image_kv))
        queries = self.norm3(queries + self.mlp(queries))
        token_kv = self.cross_attn_image_to_token.keys_values(queries + query_pe, queries)
        keys = self.norm4(keys + self.cross_attn_image_to_token.attend(image_q, token_kv))
        return queries, keys


class TwoWayTransformer(nn.Module):
    def __init__(self, depth: int = 2, embedding_dim: int = 256, num_heads: int = 8, mlp_dim: int = 2048,
                 attention_downsample_rate: int = 2) -> None:
        super().__init__()
        self.layers = [TwoWayAttentionBlock(embedding_dim, num_heads, mlp_dim, attention_downsample_rate,
                                            skip_first_layer_pe=i == 0) for i in range(depth)]
        self.final_attn_token_to_image = Attention(embedding_dim, num_heads, attention_downsample_rate)
        self.norm_final_attn = LayerNorm(embedding_dim)

    @staticmethod
    def _tokens(image_embedding: mx.array, image_pe: mx.array) -> tuple[mx.array, mx.array]:
        b, h, w, c = image_embedding.shape
        return image_embedding.reshape(b, h * w, c), image_pe.reshape(image_pe.shape[0], h * w, c)

    def image_side(self, image_embedding: mx.array, image_pe: mx.array) -> ImageSide:
        """The first block's :meth:`TwoWayAttentionBlock.image_side`: it depends on the image
        alone, so a predictor computes it once per image, not once per prompt."""
        return self.layers[0].image_side(*self._tokens(image_embedding, image_pe))

    def __call__(self, image_embedding: mx.array, image_pe: mx.array, point_embedding: mx.array,
                 image_side: ImageSide | None = None) -> tuple[mx.array, mx.array]:
        """image_embedding (B or 1, h, w, C), image_pe (1, h, w, C); point_embedding (B, n, C);
        ``image_side``: :meth:`image_side` of the same embedding, when already computed."""
        keys, key_pe = self._tokens(image_embedding, image_pe)
        queries = point_embedding
        for i, layer in enumerate(self.layers):
            queries, keys = layer(queries, keys, point_embedding, key_pe, image_side if i == 0 else None)
        q, k = queries + point_embedding, keys + key_pe
        queries = self.norm_final_attn(queries + self.final_attn_token_to_image(q, k, keys))
        return queries, keys


class MLP(nn.Module):
    def __init__(self, input_dim: int, hidden_dim: int, output_dim: int, num_layers: int) -> None:
        super().__init__()
        dims = [input_dim] + [hidden_dim] * (num_layers - 1)
        self.layers = [nn.Linear(n, k) for n, k in zip(dims, dims[1:] + [output_dim])]

    def __call__(self, x: mx.array) -> mx.array:
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == len(self.layers) - 1 else nn.relu(layer(x))
        return x


class MaskDecoder(nn.Module):
    # Seeded random weights (``-w random``) give mask logits of order 0.1, where no mask is stable
    # at the ±1 offset of everything mode; trained decoders' logits are of order ten.
    random_gains = {"output_hypernetworks_mlps.*.layers.2.weight": 100.0}

    def __init__(self, transformer_dim: int = 256, num_multimask_outputs: int = 3,
                 iou_head_depth: int = 3, iou_head_hidden_dim: int = 256) -> None:
        super().__init__()
        self.transformer = TwoWayTransformer(embedding_dim=transformer_dim)
        self.num_mask_tokens = num_multimask_outputs + 1
        self.iou_token = nn.Embedding(1, transformer_dim)
        self.mask_tokens = nn.Embedding(self.num_mask_tokens, transformer_dim)
        d = transformer_dim
        self.output_upscaling = [
            ConvTranspose2d(d, d // 4, 2, stride=2), LayerNorm(d // 4, eps=1e-6), GELU(),
            ConvTranspose2d(d // 4, d // 8, 2, stride=2), GELU(),
        ]
        self.output_hypernetworks_mlps = [MLP(d, d, d // 8, 3) for _ in range(self.num_mask_tokens)]
        self.iou_prediction_head = MLP(d, iou_head_hidden_dim, self.num_mask_tokens, iou_head_depth)

    @compiled_for_inference
    def __call__(self, image_embeddings: mx.array, image_pe: mx.array, sparse_prompt_embeddings: mx.array,
                 dense_prompt_embeddings: mx.array, multimask_output: bool,
                 image_side: ImageSide | None = None) -> tuple[mx.array, mx.array]:
        """Returns mask logits (B, 3 or 1, 4h, 4w) and predicted IoUs (B, 3 or 1). ``image_side``:
        :meth:`image_side` of the same embeddings and dense prompt, when already computed."""
        masks, iou_pred = self.predict_masks(image_embeddings, image_pe, sparse_prompt_embeddings,
                                             dense_prompt_embeddings, image_side)
        sl = slice(1, None) if multimask_output else slice(0, 1)
        return masks[:, sl], iou_pred[:, sl]

    def image_side(self, image_embeddings: mx.array, image_pe: mx.array,
                   dense_prompt_embeddings: mx.array) -> ImageSide:
        """The transformer's first projections of the image tokens, which depend only on the image
        and the dense prompt (the same "no mask" embedding for every point and box prompt)."""
        return self.transformer.image_side(image_embeddings + dense_prompt_embeddings, image_pe)

    def predict_masks(self, image_embeddings: mx.array, image_pe: mx.array, sparse_prompt_embeddings: mx.array,
                      dense_prompt_embeddings: mx.array, image_side: ImageSide | None = None
                      ) -> tuple[mx.array, mx.array]:
        b = sparse_prompt_embeddings.shape[0]
        output_tokens = mx.concatenate([self.iou_token.weight, self.mask_tokens.weight], axis=0)
        output_tokens = mx.broadcast_to(output_tokens[None], (b, *output_tokens.shape))
        tokens = mx.concatenate([output_tokens, sparse_prompt_embeddings.astype(output_tokens.dtype)], axis=1)
        # One image embedding serves every prompt in the batch: broadcast, not copied. With one
        # dense embedding for all (no mask prompt), src keeps a batch of 1, and the transformer's
        # first projections of the image tokens, the same for every prompt, run once.
        src = image_embeddings + dense_prompt_embeddings
        hs, src = self.transformer(src, image_pe, tokens, image_side)
        iou_token_out = hs[:, 0]
        mask_tokens_out = hs[:, 1:1 + self.num_mask_tokens]

        _, h, w, c = image_embeddings.shape
        up = src.reshape(b, h, w, c)
        for layer in self.output_upscaling:
            up = layer(up)
        hyper_in = mx.stack([mlp(mask_tokens_out[:, i]) for i, mlp in enumerate(self.output_hypernetworks_mlps)],
                            axis=1)
        _, uh, uw, uc = up.shape
        # (pixels × channels) @ (channels × tokens), then transposed: the same sums as SAM's
        # hyper_in @ upᵀ, in the product shape a BLAS runs several times faster.
        masks = (up.reshape(b, uh * uw, uc) @ hyper_in.transpose(0, 2, 1)).transpose(0, 2, 1)
        masks = masks.reshape(b, -1, uh, uw)
        return masks, self.iou_prediction_head(iou_token_out)
