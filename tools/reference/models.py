"""PyTorch reference definitions of dptrain's models, with the reference network's parameter names.

UNet16 and UNetResNet follow the crack-segmentation reference (TernausNet-style): same modules,
same state_dict keys, plus `width_divisor`, which divides every channel count as dptrain's
--width-divisor does (1 = the reference network). No torchvision needed: the VGG16 features and
the ResNets are spelled out here with torchvision's module names, so `encoder.*` keys match.
Differences from the reference, on purpose: dropout2d is applied only in training (the reference
keeps it on at inference).
"""
import torch
from torch import nn
from torch.nn import functional as F


class Interpolate(nn.Module):
    def __init__(self, scale_factor=2, mode="bilinear"):
        super().__init__()
        self.scale_factor = scale_factor
        self.mode = mode

    def forward(self, x):
        return F.interpolate(x, scale_factor=self.scale_factor, mode=self.mode, align_corners=False)


class ConvRelu(nn.Module):
    def __init__(self, in_, out):
        super().__init__()
        self.conv = nn.Conv2d(in_, out, 3, padding=1)
        self.activation = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.activation(self.conv(x))


class DecoderBlockV2(nn.Module):
    def __init__(self, in_channels, middle_channels, out_channels, is_deconv=False):
        super().__init__()
        if is_deconv:
            self.block = nn.Sequential(
                ConvRelu(in_channels, middle_channels),
                nn.ConvTranspose2d(middle_channels, out_channels, kernel_size=4, stride=2, padding=1),
                nn.ReLU(inplace=True))
        else:
            self.block = nn.Sequential(
                Interpolate(scale_factor=2, mode="bilinear"),
                ConvRelu(in_channels, middle_channels),
                ConvRelu(middle_channels, out_channels))

    def forward(self, x):
        return self.block(x)


def vgg16_features(d):
    """torchvision.models.vgg16().features with every channel count divided by d."""
    layers, in_ = [], 3
    for v in [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]:
        if v == "M":
            layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
        else:
            layers += [nn.Conv2d(in_, v // d, kernel_size=3, padding=1), nn.ReLU(inplace=True)]
            in_ = v // d
    return nn.Sequential(*layers)


class UNet16(nn.Module):
    def __init__(self, num_classes=1, num_filters=32, is_deconv=False, width_divisor=1):
        super().__init__()
        d = width_divisor
        nf = num_filters // d
        self.pool = nn.MaxPool2d(2, 2)
        self.encoder = vgg16_features(d)
        self.relu = nn.ReLU(inplace=True)
        e = self.encoder
        self.conv1 = nn.Sequential(e[0], self.relu, e[2], self.relu)
        self.conv2 = nn.Sequential(e[5], self.relu, e[7], self.relu)
        self.conv3 = nn.Sequential(e[10], self.relu, e[12], self.relu, e[14], self.relu)
        self.conv4 = nn.Sequential(e[17], self.relu, e[19], self.relu, e[21], self.relu)
        self.conv5 = nn.Sequential(e[24], self.relu, e[26], self.relu, e[28], self.relu)
        self.center = DecoderBlockV2(512 // d, nf * 8 * 2, nf * 8, is_deconv)
        self.dec5 = DecoderBlockV2(512 // d + nf * 8, nf * 8 * 2, nf * 8, is_deconv)
        self.dec4 = DecoderBlockV2(512 // d + nf * 8, nf * 8 * 2, nf * 8, is_deconv)
        self.dec3 = DecoderBlockV2(256 // d + nf * 8, nf * 4 * 2, nf * 2, is_deconv)
        self.dec2 = DecoderBlockV2(128 // d + nf * 2, nf * 2 * 2, nf, is_deconv)
        self.dec1 = ConvRelu(64 // d + nf, nf)
        self.final = nn.Conv2d(nf, num_classes, kernel_size=1)

    def forward(self, x):
        conv1 = self.conv1(x)
        conv2 = self.conv2(self.pool(conv1))
        conv3 = self.conv3(self.pool(conv2))
        conv4 = self.conv4(self.pool(conv3))
        conv5 = self.conv5(self.pool(conv4))
        center = self.center(self.pool(conv5))
        dec5 = self.dec5(torch.cat([center, conv5], 1))
        dec4 = self.dec4(torch.cat([dec5, conv4], 1))
        dec3 = self.dec3(torch.cat([dec4, conv3], 1))
        dec2 = self.dec2(torch.cat([dec3, conv2], 1))
        dec1 = self.dec1(torch.cat([dec2, conv1], 1))
        return self.final(dec1)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """torchvision's ResNet (v1.5: stride in the 3x3 of a bottleneck), channels divided by d."""

    def __init__(self, block, layers, d=1, num_classes=1000):
        super().__init__()
        self.inplanes = 64 // d
        self.conv1 = nn.Conv2d(3, self.inplanes, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(block, 64 // d, layers[0])
        self.layer2 = self._make_layer(block, 128 // d, layers[1], 2)
        self.layer3 = self._make_layer(block, 256 // d, layers[2], 2)
        self.layer4 = self._make_layer(block, 512 // d, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 // d * block.expansion, num_classes)

    def _make_layer(self, block, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride, bias=False),
                nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)


def resnet(depth, d=1):
    if depth == 34:
        return ResNet(BasicBlock, [3, 4, 6, 3], d)
    if depth == 101:
        return ResNet(Bottleneck, [3, 4, 23, 3], d)
    raise ValueError(f"resnet{depth} is not a dptrain encoder (34 or 101)")


class UNetResNet(nn.Module):
    def __init__(self, encoder_depth, num_classes=1, num_filters=32, dropout_2d=0.2,
                 is_deconv=False, width_divisor=1):
        super().__init__()
        d = width_divisor
        nf = num_filters // d
        self.dropout_2d = dropout_2d
        self.encoder = resnet(encoder_depth, d)
        bottom = (512 if encoder_depth == 34 else 2048) // d
        self.pool = nn.MaxPool2d(2, 2)
        self.relu = nn.ReLU(inplace=True)
        self.conv1 = nn.Sequential(self.encoder.conv1, self.encoder.bn1, self.encoder.relu, self.pool)
        self.conv2 = self.encoder.layer1
        self.conv3 = self.encoder.layer2
        self.conv4 = self.encoder.layer3
        self.conv5 = self.encoder.layer4
        self.center = DecoderBlockV2(bottom, nf * 8 * 2, nf * 8, is_deconv)
        self.dec5 = DecoderBlockV2(bottom + nf * 8, nf * 8 * 2, nf * 8, is_deconv)
        self.dec4 = DecoderBlockV2(bottom // 2 + nf * 8, nf * 8 * 2, nf * 8, is_deconv)
        self.dec3 = DecoderBlockV2(bottom // 4 + nf * 8, nf * 4 * 2, nf * 2, is_deconv)
        self.dec2 = DecoderBlockV2(bottom // 8 + nf * 2, nf * 2 * 2, nf * 2 * 2, is_deconv)
        self.dec1 = DecoderBlockV2(nf * 2 * 2, nf * 2 * 2, nf, is_deconv)
        self.dec0 = ConvRelu(nf, nf)
        self.final = nn.Conv2d(nf, num_classes, kernel_size=1)

    def forward(self, x):
        conv1 = self.conv1(x)
        conv2 = self.conv2(conv1)
        conv3 = self.conv3(conv2)
        conv4 = self.conv4(conv3)
        conv5 = self.conv5(conv4)
        center = self.center(self.pool(conv5))
        dec5 = self.dec5(torch.cat([center, conv5], 1))
        dec4 = self.dec4(torch.cat([dec5, conv4], 1))
        dec3 = self.dec3(torch.cat([dec4, conv3], 1))
        dec2 = self.dec2(torch.cat([dec3, conv2], 1))
        dec1 = self.dec1(dec2)
        dec0 = self.dec0(dec1)
        return self.final(F.dropout2d(dec0, p=self.dropout_2d, training=self.training))


def make(name, width_divisor=1, is_deconv=False):
    """The reference model for a dptrain --model name."""
    if name == "unet16":
        return UNet16(is_deconv=is_deconv, width_divisor=width_divisor)
    if name == "unet_resnet34":
        return UNetResNet(34, is_deconv=is_deconv, width_divisor=width_divisor)
    if name == "unet_resnet101":
        return UNetResNet(101, is_deconv=is_deconv, width_divisor=width_divisor)
    raise ValueError(f"unknown model {name}")


def lively_init(model):
    """He-uniform weights and positive biases: at small widths PyTorch's default init leaves
    many ReLUs dead (zero gradients, constant logits), which would make comparisons say little.
    Values are float32-representable."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                bound = (6.0 / p[0].numel()) ** 0.5  # p[0].numel() is PyTorch's fan_in
                p.uniform_(-bound, bound)
            elif name.endswith("bias"):
                p.uniform_(0.05, 0.3)
            else:  # batch-norm weight
                p.uniform_(0.5, 1.5)
            p.copy_(p.to(torch.float32).to(p.dtype))
