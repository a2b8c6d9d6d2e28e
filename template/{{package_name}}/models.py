"""Models: a small ResNet for images, a tiny MLP, or any torchvision classifier.

A model maps a batch of inputs (N, *DataInfo.input_shape) to outputs (N, num_classes).
YOUR MODEL HERE: write a builder that takes the data set's DataInfo and add it to MODELS;
`--model NAME` then trains it (the README shows a 1-d convolutional one).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn


def build_model(name: str, info) -> nn.Module:
    """The model --model names, shaped for the data (`info`: data.DataInfo)."""
    if name in MODELS:
        return MODELS[name](info)
    import torchvision

    model = torchvision.models.get_model(name, weights=None, num_classes=info.num_classes)
    if info.input_shape[0] != 3:
        replace_first_conv(model, info.input_shape[0])
    return model


def model_names() -> list[str]:
    """torchvision's classifiers, which --model also takes."""
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


def replace_first_conv(model: nn.Module, in_channels: int) -> None:
    """Give a torchvision classifier's first convolution `in_channels` inputs."""
    for parent in model.modules():
        for child_name, child in parent.named_children():
            if isinstance(child, nn.Conv2d) and child.groups == 1:
                conv = nn.Conv2d(
                    in_channels,
                    child.out_channels,
                    child.kernel_size,
                    child.stride,
                    child.padding,
                    child.dilation,
                    bias=child.bias is not None,
                )
                setattr(parent, child_name, conv)
                return
    raise ValueError(f"{type(model).__name__} has no Conv2d whose input channels could be set")


class BasicBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        # No conv bias before BatchNorm: the norm's own shift makes it redundant.
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        # Start each residual branch at zero so the block begins as the identity.
        nn.init.zeros_(self.bn2.weight)
        self.shortcut = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNetSmall(nn.Module):
    """A ResNet for 32x32 inputs: a 3x3 stem and three stages of basic blocks."""

    def __init__(
        self, num_classes: int, in_channels: int = 3, widths=(16, 32, 64), blocks=(1, 1, 1)
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False),
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(inplace=True),
        )
        layers, in_planes = [], widths[0]
        for stage, (planes, count) in enumerate(zip(widths, blocks, strict=True)):
            for i in range(count):
                layers.append(BasicBlock(in_planes, planes, 2 if stage > 0 and i == 0 else 1))
                in_planes = planes
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_planes, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.layers(self.stem(x)))
        return self.fc(torch.flatten(x, 1))


class MLP(nn.Module):
    """Flatten, one hidden layer: the smallest model worth training, for overhead tests."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 256) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


# --model names and their builders, which take the data set's DataInfo.
MODELS = {
    "resnet_small": lambda info: ResNetSmall(info.num_classes, info.input_shape[0]),
    "mlp": lambda info: MLP(math.prod(info.input_shape), info.num_classes),
}
