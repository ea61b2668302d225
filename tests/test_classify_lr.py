"""timm's schedule keys beside train.lr's warm-up and decay (found from outside: a recipe of --min-lr,
--warmup-lr and --cooldown-epochs had no keys): what each does to the rate, and where each is refused."""

import pytest
from test_classify import tiny

import bigbatch
from bigbatch.tasks.classify.lr import lr_schedule


def test_a_warm_up_from_its_rate_a_decay_to_its_floor_and_a_cool_down_held_there():
    over = {"train.kimg": 12, "train.warmup_kimg": 1, "train.warmup_lr": 0.04, "train.lr": 0.4}
    cfg = tiny(**over, **{"train.lr_decay": "cosine", "train.lr_min": 0.1, "train.cooldown_kimg": 1})
    lr = lr_schedule(cfg)  # batch 64 at lr_batch 64: no scaling
    assert lr(0) == pytest.approx(0.04) and lr(500) == pytest.approx(0.22) and lr(1000) == pytest.approx(0.4)
    assert lr(6000) == pytest.approx(0.25)  # half-way from 1 to 11 kimg: half-way from 0.4 to 0.1
    assert lr(11_000) == lr(11_500) == pytest.approx(0.1)  # the cool-down, at the floor
    linear = lr_schedule(cfg.override({"train.lr_decay": "linear"}))
    assert linear(3500) == pytest.approx(0.325) and linear(11_999) == pytest.approx(0.1)
    # Scaled to the batch as train.lr is: twice the batch, twice each rate.
    doubled = lr_schedule(cfg.override({"train.batch": 128}))
    assert doubled(0) == pytest.approx(0.08) and doubled(11_500) == pytest.approx(0.2)


@pytest.mark.parametrize(
    "over, said",
    [
        ({"train.lr_min": 0.01}, 'config key \'train.lr_min\' is read by train.lr_decay "linear", "cosine" or "plat'),
        ({"train.lr_decay": "cosine", "train.lr_min": 0.5}, "'train.lr_min' must be below train.lr (0.2), got 0.5"),
        ({"train.warmup_lr": 0.01}, "'train.warmup_lr' is the rate a warm-up starts at, and there is none"),
        ({"train.lr_decay": "linear", "train.cooldown_kimg": 0.6}, "and train.warmup_kimg leave nothing of the run's"),
        ({"data.schedule": "0:16:64:0.1:0.2", "train.lr_min": 0.01}, "gives each phase an lr, so train.lr_min must"),
    ],
)
def test_a_schedule_key_nothing_reads_is_one_line(over, said):
    with pytest.raises(bigbatch.BigbatchError) as e:
        bigbatch.train(tiny(**over), quiet=True)
    assert said in str(e.value), e.value


def test_a_gan_refuses_them():
    with pytest.raises(bigbatch.BigbatchError, match="config key 'train.lr_min' is not read by the GAN task"):
        bigbatch.train(bigbatch.preset("digits").override({"train.lr_min": 0.01}), quiet=True)


def test_the_start_line_says_the_rate_the_batch_scaled(tmp_path, capsys):
    # Found from outside: the rate train.lr became at the run's batch was unsaid (timm says the one it computed).
    cfg = tiny(
        **{"train.kimg": 0.064, "train.batch": 32, "train.micro_batch": 32, "train.lr": 0.2, "train.lr_batch": 64}
    )
    bigbatch.train(cfg.override({"eval.every_kimg": 0, "sample.every_kimg": 0}), run_dir=tmp_path / "r")
    start = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("Training "))
    assert "; lr 0.1 (train.lr 0.2 per 64 images, scaled linearly to the batch of 32);" in start, start
