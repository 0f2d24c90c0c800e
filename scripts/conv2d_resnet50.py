"""torchvision ResNet-50 with every conv through jitops.conv2d (scripts/device_conv2d.py's "resnet"
section): BatchNorm folded into the conv weights and bias, ReLU and the residual Add fused into
the conv epilogue, channels_last fp16; max-pool, average-pool and fc stay in torch."""
from __future__ import annotations

import torch

import jitops

CL = torch.channels_last


def fold(conv, bn, dtype=torch.float16):
    """Conv + inference BatchNorm as one conv with bias, folded in fp32, then cast."""
    scale = bn.weight.float() / torch.sqrt(bn.running_var.float() + bn.eps)
    w = conv.weight.float() * scale[:, None, None, None]
    b = bn.bias.float() - bn.running_mean.float() * scale
    return w.detach().to(dtype).contiguous(), b.detach().to(dtype).contiguous()


class JitResNet(torch.nn.Module):
    """torchvision ResNet-50 with every conv (BN folded, ReLU and the residual Add fused) through jitops."""

    def __init__(self, model, pools):
        super().__init__()
        self.m = pools
        self.stem = fold(model.conv1, model.bn1)
        self.blocks = []
        for layer in (model.layer1, model.layer2, model.layer3, model.layer4):
            for blk in layer:
                ds = fold(blk.downsample[0], blk.downsample[1]) if blk.downsample is not None else None
                dss = blk.downsample[0].stride if blk.downsample is not None else None
                self.blocks.append((fold(blk.conv1, blk.bn1), fold(blk.conv2, blk.bn2), blk.conv2.stride,
                                    fold(blk.conv3, blk.bn3), ds, dss))

    def forward(self, x):
        w, b = self.stem
        x = jitops.conv2d(x, w, b, stride=2, padding=3, activation="relu")
        x = self.m.maxpool(x)
        for c1, c2, s2, c3, ds, dss in self.blocks:
            idn = x if ds is None else jitops.conv2d(x, ds[0], ds[1], stride=dss)
            y = jitops.conv2d(x, c1[0], c1[1], activation="relu")
            y = jitops.conv2d(y, c2[0], c2[1], stride=s2, padding=1, activation="relu")
            x = jitops.conv2d(y, c3[0], c3[1], residual=idn, activation="relu")
        x = torch.flatten(self.m.avgpool(x), 1)
        return self.m.fc(x)


def section_resnet(out_dir: str, graph_us, rel_err, dump) -> dict:
    """Both models captured in CUDA graphs (graph_us); output errors against the fp32 model."""
    import torchvision.models as tvm
    torch.manual_seed(0)
    model32 = tvm.resnet50().eval().cuda()
    x32 = torch.randn(8, 3, 224, 224, device="cuda")
    with torch.no_grad():
        ref = model32(x32).double()
        model = tvm.resnet50().eval().cuda()
        model.load_state_dict(model32.state_dict())
        model = model.half().to(memory_format=CL)
        x = x32.half().to(memory_format=CL)
        jm = JitResNet(model32, model)
        y_t = model(x)
        y_j = jm(x)
        torch.cuda.synchronize()
        res = {"err_torch_fp16_vs_fp32": rel_err(y_t, ref), "err_jitops_fp16_vs_fp32": rel_err(y_j, ref)}
        res["torch_us"] = graph_us(lambda: model(x))
        res["jitops_us"] = graph_us(lambda: jm(x))
    res["ratio"] = res["torch_us"] / res["jitops_us"]
    print(f"resnet50 b8 fp16 channels_last: torch {res['torch_us']:.0f} us, jitops {res['jitops_us']:.0f} us, "
          f"ratio {res['ratio']:.2f}; errors vs fp32: torch {res['err_torch_fp16_vs_fp32']:.2e} "
          f"jitops {res['err_jitops_fp16_vs_fp32']:.2e}", flush=True)
    dump(out_dir, "resnet", res)
    return res
