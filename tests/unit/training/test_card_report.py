"""training/card_report.py: the card's report, card.md, as a reader sees it (each check beside its noise; each preset
fitting its cap, failing at a phase, skipped, stopped, stale or not yet measured; nanoGPT's path; the profile; the
hours), and docs/cards/README.md's table of presets by committed report, which must be the reports' own."""
import os

from training import card_checks, card_report
from training.card_train import preset_paths
from training.card_measure import ROOT, SPEEDRUN

GIB = 2 ** 30


def fake_check(passed):
    return dict(passed=passed, loss=5.2, reference_loss=5.1, loss_difference=1e-4, loss_noise=2e-4,
                gradient_parameter='lm_head.weight', gradient_difference=3e-3, gradient_noise=1e-3,
                tolerance=card_checks.NOISE_MULTIPLE)


FITS = dict(preset=SPEEDRUN, card_gib=12, cap_bytes=11 * GIB, estimated_peak_bytes=8 * GIB,
            estimated_total_bytes=10 * GIB, estimate_fits=True, phase_reached='done', fits=True,
            max_allocated_bytes=8 * GIB, max_reserved_bytes=int(8.5 * GIB), compile_seconds=42.0,
            resume_compile_seconds=6.0, step_seconds=0.5, eval_micro_batch_seconds=0.05, tokens_per_s=100000.0,
            mfu=0.4, train_hours=1.5, eval_hours=0.25, hours=1.75, tokens=917504000)
FAIL = dict(preset='train_gpt2_4gb.py', card_gib=4, cap_bytes=3 * GIB, estimated_peak_bytes=2 * GIB,
            estimated_total_bytes=3 * GIB, phase_reached='evaluation', fits=False, max_allocated_bytes=2 * GIB,
            max_reserved_bytes=int(2.9 * GIB), error='error: out of memory during evaluation at micro-batch 4.')
PROFILED = dict(micro_batch=[1, 8192], micro_steps=64, compiled=True, dtype='bfloat16', optim='muon', seconds=2.0,
                profiled_seconds=1.9, shares=dict(optimizer=0.1, attention=0.3, loss=0.05, matmul=0.4, other=0.15),
                top=[dict(name='sm90_xmma_gemm_bf16', category='matmul', seconds=0.5, share=0.26)])


def test_the_report_gives_each_check_beside_its_noise_and_each_preset_as_its_card_saw_it():
    result = dict(device='NVIDIA H100', torch='2.11.0', scaled_down=False, runs=[
        dict(seconds=480.0, measured=['a', 'b'], left=[]), dict(seconds=12.0, measured=[], left=[])],
        checks={'compiled against eager': fake_check(True), 'bf16 weights against fp32': dict(fake_check(False),
                                                                                           stale=True),
                'varlen kernel against masked': dict(skipped='no kernel')},
        card_presets=[SPEEDRUN, 'train_gpt2_4gb.py', 'finetune_gpt2xl_8gb.py', 'train_gpt2_6gb.py',
                      'finetune_gpt2large_8gb.py'],
        presets=[FITS, FAIL, dict(preset='finetune_gpt2xl_8gb.py', card_gib=8, cap_bytes=None,
                                  skipped="optim='adamw_8bit' needs torchao"),
                 dict(preset='finetune_gpt2large_8gb.py', card_gib=8, cap_bytes=int(7.4 * GIB), phase_reached='step',
                      fits=None, stopped='stopped after 600 s (card_preset_seconds) while step')],
        nanogpt_path=None, profile={SPEEDRUN: PROFILED, 'stale': True})
    lines = card_report.markdown(result).splitlines()
    assert lines[:3] == ['# NVIDIA H100', '', 'torch 2.11.0; 2 runs of the card: 480 s, 2 parts measured; 12 s, '
                                             '0 parts measured.']
    assert ('| compiled against eager | pass | 5.2000 (5.1000) | 1.0e-04 (noise 2.0e-04) | 3.0e-03 (noise 1.0e-03), '
            'lm_head.weight | 4x noise |') in lines
    assert any(line.startswith(f'| bf16 weights against fp32 | FAIL{card_report.STALE} | ') for line in lines)
    assert '| varlen kernel against masked | skipped: no kernel | | | | |' in lines
    assert [line.split(' | ')[0][2:] for line in lines if line.endswith('| not yet measured | | | | |')] == [
        name for name, _ in card_checks.CHECKS if name not in result['checks']]  # those a later run adds
    assert (f'| {SPEEDRUN} | 12 GB | 11.00 | 8.00 (10.00) | 8.00 / 8.50 | done | fits (8.50 / 11.00 GiB) | 42 (6) '
            f'| 0.500 | 0.0500 | 100,000 | 40.0% | 1.50 + 0.25 |') in lines
    assert ('| train_gpt2_4gb.py | 4 GB | 3.00 | 2.00 (3.00) | 2.00 / 2.90 | evaluation | FAIL at evaluation: error: '
            'out of memory during evaluation at micro-batch 4. | n/a (n/a) | n/a | n/a | n/a | n/a | n/a + n/a |'
            ) in lines
    assert ("| finetune_gpt2xl_8gb.py | 8 GB | n/a | n/a | n/a / n/a |  | skipped: optim='adamw_8bit' needs torchao "
            "| n/a (n/a) |") in card_report.markdown(result)
    assert any(line.startswith('| finetune_gpt2large_8gb.py | 8 GB | 7.40 | ') and
               '| step | stopped after 600 s (card_preset_seconds) while step |' in line for line in lines)
    assert '| train_gpt2_6gb.py |  | n/a | n/a | n/a / n/a |  | not yet measured | n/a (n/a) | n/a | n/a | n/a | ' \
           'n/a | n/a + n/a |' in lines
    assert (f'{SPEEDRUN}: 917,504,000 tokens in 1.75 h at the measured rate: 1.50 h of training steps and 0.25 h of '
            f"loss evaluations (HellaSwag's not included).") in lines
    assert "nanoGPT's path, config/train_gpt2.py: not yet measured." in lines
    assert (f"Profile{card_report.STALE} of config/{SPEEDRUN}'s step (64 micro-batches of 1 x 8192, bfloat16, muon, "
            f"compiled): 2.000 s, 1.900 s of it profiled: the optimizer 10%, attention 30%, the loss 5%, matmuls 40%, "
            f"other 15%.") in lines
    assert '| `sm90_xmma_gemm_bf16` | matmuls | 500.00 | 26.0% |' in lines


def test_the_cards_table_is_fits_fail_or_not_yet_measured_by_preset_and_report():
    reports = {'rtx-3060-12gb-torch2.11': dict(device='NVIDIA GeForce RTX 3060', torch='2.11.0+cu128', presets=[
        FITS, FAIL, dict(preset='train_gpt2_6gb.py', card_gib=6, cap_bytes=None, skipped='needs torchao')])}
    table = card_report.coverage([SPEEDRUN, 'train_gpt2_4gb.py', 'train_gpt2_6gb.py', 'speedrun_gpt2_8gb.py'], reports)
    assert table.splitlines() == [
        '| preset | [NVIDIA GeForce RTX 3060, torch 2.11.0](rtx-3060-12gb-torch2.11.md) |', '|---|---|',
        f'| {SPEEDRUN} | fits (8.50 / 11.00 GiB) |', '| train_gpt2_4gb.py | FAIL at evaluation |',
        '| train_gpt2_6gb.py | not yet measured |', '| speedrun_gpt2_8gb.py | not yet measured |']


def test_the_readme_of_docs_cards_holds_the_table_of_its_committed_reports():
    """Regenerate it after committing a report: python -m training.card_report docs/cards."""
    folder = os.path.join(ROOT, 'docs', 'cards')
    with open(os.path.join(folder, 'README.md'), encoding='utf-8') as f:
        readme = f.read()
    names = [os.path.basename(path) for path in preset_paths(os.path.join(ROOT, 'config'))]
    table = card_report.coverage(names, card_report.committed_reports(folder))
    assert table in readme
