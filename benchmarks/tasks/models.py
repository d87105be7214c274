"""CIFAR models of the papers' experiments: ResNet-20, Wide ResNets and a CIFAR SqueezeNet.

ResNet-50 for ImageNet is torchvision's and is built in ``benchmarks/tasks/imagenet.py``. The
definitions are the standard ones the papers cite: ResNet-20 and WRN-16-4 for DANA (arXiv:1907.11612,
Sec. 5.1 and App. A.5; WRN without dropout, our reading, as the paper gives no rate), ResNet-20,
WRN-16-8 and SqueezeNet for LPP-SGD (arXiv:2203.06638, Sec. 4; defined in its code,
github.com/bapi/LPP-SGD ``models/``), whose parameter counts the tests check where they apply.
"""

from __future__ import annotations

import torch
from torch import nn


def _init_weights(model: nn.Module) -> None:
    # He et al. (2015) normal init on the conv fan-out, as the CIFAR ResNet code LPP-SGD uses
    # (epfml/LocalSGD ``ResNet_cifar``); BN starts as the identity. Linear layers keep PyTorch's init.
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.BatchNorm2d):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)


def _conv_bn(in_ch: int, out_ch: int, kernel: int, stride: int = 1) -> list[nn.Module]:
    conv = nn.Conv2d(in_ch, out_ch, kernel, stride, padding=kernel // 2, bias=False)
    return [conv, nn.BatchNorm2d(out_ch)]


class _BasicBlock(nn.Module):
    """Post-activation basic block: conv-BN-ReLU-conv-BN, plus the shortcut, then ReLU."""

    def __init__(self, in_ch: int, out_ch: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            *_conv_bn(in_ch, out_ch, 3, stride), nn.ReLU(inplace=True), *_conv_bn(out_ch, out_ch, 3)
        )
        # Option B of He et al.: a 1x1 conv + BN projection where the shape changes, identity elsewhere.
        reshapes = stride != 1 or in_ch != out_ch
        self.shortcut = nn.Sequential(*_conv_bn(in_ch, out_ch, 1, stride)) if reshapes else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


def resnet20(num_classes: int = 10) -> nn.Module:
    """ResNet-20 for 32x32 inputs (He et al., CVPR 2016, Section 4.2).

    A 3x3 stem with 16 channels, then 3 stages of 3 basic blocks with 16, 32 and 64 channels (stride 2
    at the start of stages 2 and 3), global average pooling and a linear classifier. The shortcuts
    where the shape changes are **1x1 conv + BN projections** (option B), not the paper's zero-padded
    identity (option A): this is the definition LPP-SGD's code uses (epfml/LocalSGD ``ResNet_cifar``),
    with 65 parameter tensors, 272,474 parameters for 10 classes and 278,324 for 100 (counted by us;
    LPP-SGD, arXiv:2203.06638, Sec. 3 splits these tensors into blocks). Option A would have 269,722.

    Args:
        num_classes: outputs of the classifier (10 for CIFAR-10, 100 for CIFAR-100).
    """
    layers: list[nn.Module] = [*_conv_bn(3, 16, 3), nn.ReLU(inplace=True)]
    in_ch = 16
    for stage, out_ch in enumerate((16, 32, 64)):
        for block in range(3):
            layers.append(_BasicBlock(in_ch, out_ch, stride=2 if stage > 0 and block == 0 else 1))
            in_ch = out_ch
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, num_classes)]
    model = nn.Sequential(*layers)
    _init_weights(model)
    return model


class _WideBlock(nn.Module):
    """Pre-activation wide block: BN-ReLU-conv3x3-BN-ReLU-dropout-conv3x3, plus the shortcut."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, dropout: float) -> None:
        super().__init__()
        self.pre = nn.Sequential(nn.BatchNorm2d(in_ch), nn.ReLU(inplace=True))
        self.body = nn.Sequential(
            nn.Conv2d(in_ch, out_ch, 3, stride, padding=1, bias=False),
            nn.BatchNorm2d(out_ch),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Conv2d(out_ch, out_ch, 3, 1, padding=1, bias=False),
        )
        # As the authors' code: where the shape changes, a 1x1 conv on the pre-activated input.
        reshapes = stride != 1 or in_ch != out_ch
        self.project = nn.Conv2d(in_ch, out_ch, 1, stride, bias=False) if reshapes else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        activated = self.pre(x)
        shortcut = x if self.project is None else self.project(activated)
        return self.body(activated) + shortcut


def wide_resnet(depth: int, widen_factor: int, num_classes: int, dropout: float = 0.0) -> nn.Module:
    """Wide ResNet WRN-``depth``-``widen_factor`` for 32x32 inputs (Zagoruyko & Komodakis, BMVC 2016).

    The standard definition: pre-activation blocks, bias-free convs, (depth - 4) / 6 blocks in each of
    3 stages of 16k, 32k and 64k channels (k = ``widen_factor``), then BN-ReLU, global average pooling
    and a linear classifier. With 10 classes WRN-16-4 has 2.75M parameters, WRN-16-8 10.96M. LPP-SGD's
    own ``wideresnet.py`` differs in details: conv biases (4,496 more parameters in WRN-16-8), Xavier
    init, the stride on a block's second conv, and a final BN with ``momentum=0.9`` (its
    ``models/wideresnet.py``, github.com/bapi/LPP-SGD).

    Args:
        depth: total depth, 6n + 4 (16 for WRN-16-k).
        widen_factor: channel multiplier k.
        num_classes: outputs of the classifier.
        dropout: dropout probability between the two convs of each block; DANA uses 0 (our reading:
            arXiv:1907.11612 gives no rate), LPP-SGD's WRN-16-8 0.3.
    """
    if depth < 10 or (depth - 4) % 6:
        raise ValueError(f"Arg ``depth`` must be 6n + 4 with n >= 1, got {depth}.")
    if widen_factor < 1:
        raise ValueError(f"Arg ``widen_factor`` must be a positive integer, got {widen_factor}.")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"Arg ``dropout`` must be in [0, 1), got {dropout}.")
    blocks = (depth - 4) // 6
    layers: list[nn.Module] = [nn.Conv2d(3, 16, 3, padding=1, bias=False)]
    in_ch = 16
    for stage, width in enumerate((16, 32, 64)):
        out_ch = width * widen_factor
        for block in range(blocks):
            layers.append(_WideBlock(in_ch, out_ch, 2 if stage > 0 and block == 0 else 1, dropout))
            in_ch = out_ch
    layers += [nn.BatchNorm2d(in_ch), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    layers.append(nn.Linear(in_ch, num_classes))
    model = nn.Sequential(*layers)
    _init_weights(model)
    return model


class _Fire(nn.Module):
    """Fire module with BN: squeeze 1x1, then concatenated 1x1 and 3x3 expands, each conv-BN-ReLU."""

    def __init__(self, in_ch: int, out_ch: int, squeeze: int) -> None:
        super().__init__()

        def conv_bn_relu(a: int, b: int, kernel: int) -> nn.Sequential:
            conv = nn.Conv2d(a, b, kernel, padding=kernel // 2)
            return nn.Sequential(conv, nn.BatchNorm2d(b), nn.ReLU(inplace=True))

        self.squeeze = conv_bn_relu(in_ch, squeeze, 1)
        self.expand_1x1 = conv_bn_relu(squeeze, out_ch // 2, 1)
        self.expand_3x3 = conv_bn_relu(squeeze, out_ch // 2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.squeeze(x)
        return torch.cat([self.expand_1x1(x), self.expand_3x3(x)], 1)


class SqueezeNetCifar(nn.Module):
    """SqueezeNet with simple bypass for 32x32 inputs, the model of LPP-SGD's SqueezeNet experiments.

    Stem conv3x3-96 + BN + ReLU + maxpool (32 -> 16), Fire2-9 with identity bypasses around Fire3,
    5 and 7 and maxpools after Fire4 and Fire8, a 1x1 ``conv10`` to the classes and global average
    pooling (Iandola et al. 2016, with BN added, as LPP-SGD's ``models/`` at github.com/bapi/LPP-SGD). It has 102 parameter
    tensors and 734,986 parameters for 10 classes, 781,156 for 100. torchvision's ``squeezenet1_1``
    also runs on 32x32 inputs, but its stride-2 stem and three pools leave 1x1 maps from Fire6 on.

    Args:
        num_classes: outputs of ``conv10``.
    """

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 96, 3, padding=1), nn.BatchNorm2d(96), nn.ReLU(inplace=True), nn.MaxPool2d(2)
        )
        # (in, out, squeeze) channels of Fire2 ... Fire9.
        specs = [(96, 128, 16), (128, 128, 16), (128, 256, 32), (256, 256, 32)]
        specs += [(256, 384, 48), (384, 384, 48), (384, 512, 64), (512, 512, 64)]
        self.fires = nn.ModuleList(_Fire(*spec) for spec in specs)
        self.pool = nn.MaxPool2d(2)
        self.conv10 = nn.Conv2d(512, num_classes, 1)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
        # PyTorch's default init, as LPP-SGD's code: a fan-out He init of the 1x1 classifier conv
        # (fan-out = num_classes) would start from logits ten times larger (std ~3 instead of ~0.3).

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f2, f3, f4, f5, f6, f7, f8, f9 = self.fires
        x = f2(self.stem(x))
        x = self.pool(f4(f3(x) + x))
        x = f6(f5(x) + x)
        x = self.pool(f8(f7(x) + x))
        return self.head(self.conv10(f9(x)))


def squeezenet_cifar(num_classes: int) -> nn.Module:
    """Build :class:`SqueezeNetCifar` with ``num_classes`` outputs."""
    return SqueezeNetCifar(num_classes)
