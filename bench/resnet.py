"""ResNet-50, written from the paper (He et al., 2015, "Deep Residual Learning for Image Recognition").

torchvision does not import beside the CPU build of torch used here, so the
benchmarks define the network themselves. Architecture (paper, Table 1, the
50-layer column): a 7x7/2 convolution with 64 filters, 3x3/2 max pooling, four
stages of bottleneck blocks (1x1, 3x3, 1x1 convolutions with expansion 4) with
3, 4, 6 and 3 blocks and widths 64, 128, 256 and 512, global average pooling
and a 1000-way fully connected layer. Batch normalisation follows every
convolution (paper, section 3.4). Projection shortcuts (1x1 convolutions,
option B) are used where the shape changes; as in the paper, the stride-2
downsampling of stages 3-5 is done by the first 1x1 convolution of the first
block.
"""

from __future__ import annotations

import torch
from torch import nn


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int) -> None:
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, stride=stride, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(out_ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        y: torch.Tensor = self.relu(out + self.shortcut(x))
        return y


class ResNet50(nn.Module):
    STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        blocks: list[nn.Module] = []
        in_ch = 64
        for width, count, stride in self.STAGES:
            for i in range(count):
                blocks.append(Bottleneck(in_ch, width, stride if i == 0 else 1))
                in_ch = width * Bottleneck.expansion
        self.layers = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_ch, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        y: torch.Tensor = self.fc(torch.flatten(self.pool(x), 1))
        return y


def count_layers(model: nn.Module) -> int:
    """Weighted layers (convolutions on the main path and the classifier), 50 for ResNet-50."""
    main = [m for name, m in model.named_modules()
            if isinstance(m, nn.Conv2d | nn.Linear) and "shortcut" not in name]
    return len(main)
