"""Where CLIP's zero-shot build spends its time, unitok against open_clip (clip_vs_open_clip's config)."""
import cProfile, pstats, sys, time
sys.path.insert(0, "benchmarks")
import torch
import clip_vs_open_clip as b
from timing import prepare_process

dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
args = b.parse_args(["--device", dev, "--threads", "4", "--skip-train", *sys.argv[2:]])
prepare_process(args)
ours, theirs = b.build_models(args)
import open_clip
from open_clip.zero_shot_classifier import build_zero_shot_classifier
from unitok.zero_shot import ZeroShotClassifier
classnames, templates = b.prompts(args)
oc_tok = open_clip.get_tokenizer("ViT-B-32")
per = max(1, args.text_batch // len(templates))

def sync():
    if dev == "cuda": torch.cuda.synchronize()

def ours_build():
    return ZeroShotClassifier(ours, classnames, templates, batch_size=per * len(templates)).class_embeddings

def theirs_build():
    return build_zero_shot_classifier(theirs, oc_tok, classnames, templates, num_classes_per_batch=per, device=dev)

clf = ZeroShotClassifier(ours, classnames, templates, batch_size=per * len(templates))
texts = [t for g in clf.prompts for t in g]
tok = ours.text_tokenizer()
def ours_tok():
    for s in range(0, len(texts), clf.batch_size): tok(texts[s:s + clf.batch_size])
def ours_tok_to():
    for s in range(0, len(texts), clf.batch_size): tok(texts[s:s + clf.batch_size]).to(dev)
def theirs_tok():
    for s in range(0, len(texts), clf.batch_size): oc_tok(texts[s:s + clf.batch_size])
ids_all = [tok(texts[s:s + clf.batch_size]).to(dev) for s in range(0, len(texts), clf.batch_size)]
def ours_encode_only():
    with torch.no_grad():
        for ids in ids_all: ours.encode_text(ids)
oc_ids = [oc_tok(texts[s:s + clf.batch_size]).to(dev) for s in range(0, len(texts), clf.batch_size)]
def theirs_encode_only():
    with torch.no_grad():
        for ids in oc_ids: theirs.encode_text(ids)
print("ids shapes unitok", [tuple(i.shape) for i in ids_all[:3]], "open_clip", tuple(oc_ids[0].shape), flush=True)
fns = dict(ours_build=ours_build, theirs_build=theirs_build, ours_tok=ours_tok, ours_tok_to=ours_tok_to,
           theirs_tok=theirs_tok, ours_encode_only=ours_encode_only, theirs_encode_only=theirs_encode_only)
for f in fns.values(): f(); sync()
for rep in range(2):
    for name, f in fns.items():
        sync(); t = time.perf_counter(); f(); sync()
        print(f"rep {rep} {name:20s} {time.perf_counter() - t:7.3f} s", flush=True)
for name in ("ours_build", "theirs_build"):
    pr = cProfile.Profile(); pr.enable(); fns[name](); sync(); pr.disable()
    print("=== cProfile", name); pstats.Stats(pr).sort_stats("tottime").print_stats(18)
