"""Models: a small ResNet for 32x32 images, a tiny MLP, or any torchvision classifier.

To train your own network, edit `build_model` below: it receives the number of classes and
input channels of the data set and returns an `nn.Module` that maps a batch of images
(N, C, H, W) to logits (N, num_classes).
"""

from __future__ import annotations

import torch
import torch.nn as nn

BUILT_IN = ("resnet_small", "mlp")


def build_model(name: str, num_classes: int, in_channels: int, image_size: int) -> nn.Module:
    """Return the model to train. YOUR MODEL HERE: add a branch or replace the body."""
    if name == "resnet_small":
        return ResNetSmall(num_classes, in_channels)
    if name == "mlp":
        return MLP(in_channels * image_size * image_size, num_classes)
    return torchvision_model(name, num_classes, in_channels)


def model_names() -> list[str]:
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


def torchvision_model(name: str, num_classes: int, in_channels: int) -> nn.Module:
    """A randomly initialised torchvision classifier with its input and output resized."""
    import torchvision

    model = torchvision.models.get_model(name, weights=None, num_classes=num_classes)
    if in_channels != 3:
        _replace_first_conv(model, in_channels)
    return model


def _replace_first_conv(model: nn.Module, in_channels: int) -> None:
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
