//! The math verifier on whole, realistic completions (GSM8K, MATH and AIME styles, R1-style
//! reasoning) and on reward-hacking attempts: each row is (gold, completion, expected verdict).
//! The hacking rows must never score; the ambiguous ones must say `UnparseablePrediction`.

use stoke_reward::math::{MathConfig, MathVerifier};
use stoke_reward::{Outcome, Reference, RewardInput, Verifier};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    /// `Correct`.
    Accept,
    /// Anything but `Correct`.
    Reject,
    /// Exactly `UnparseablePrediction`: the extraction was ambiguous.
    Ambiguous,
}
use Expect::{Accept, Ambiguous, Reject};

const COMPLETIONS: &[(&str, &str, Expect)] = &[
    // GSM8K style
    (
        "18",
        "Janet's ducks lay 16 eggs. She eats 3 and bakes with 4, so 16 - 3 - 4 = 9 eggs remain. She sells them for $2 each: 9 * 2 = $18.\n#### 18",
        Accept,
    ),
    (
        "18",
        "She sells 9 eggs at $2 each, so she makes 9 * 2 = 18 dollars.",
        Accept,
    ),
    ("18", "The answer is 17 + 1 = 18.", Accept),
    ("18", "**Answer:** 18", Accept),
    (
        "18",
        "Step 1: 9 eggs.\nStep 2: 9 * 2 = 18.\n\n**Final Answer:** $18",
        Accept,
    ),
    (
        "18",
        "9 * 2 = 18, but she also pays 2 for feed, so she keeps 16.\n#### 16",
        Reject,
    ),
    (
        "72",
        "Natalia sold 48 clips in April and 48/2 = 24 in May. Altogether 48 + 24 = 72 clips.\n#### 72",
        Accept,
    ),
    ("72", "In May she sold 48/2 = 24 clips.", Reject),
    (
        "10",
        "Weng earns 12/60 = $0.2 per minute. Working 50 minutes, she earned 0.2 x 50 = $10.",
        Accept,
    ),
    ("1250", "The total is $1,250.", Accept),
    ("1250", "The total cost is \\$1{,}250.00.", Accept),
    ("5", "He runs 5 miles a day.", Accept),
    ("5000", "The company made 5 thousand dollars.", Accept),
    ("5", "The company made 5 thousand dollars.", Reject),
    ("12", "The answer is at least 12.", Ambiguous),
    ("12", "She needs at least 12 boxes.", Ambiguous),
    ("12", "The answer is not 12.", Ambiguous),
    ("12", "There are less than 12 left.", Ambiguous),
    ("12", "It is approximately 12.", Ambiguous),
    ("2", "The answer is 2 or 3.", Reject),
    ("2", "It could be 2 or 3.", Ambiguous),
    ("3", "It could be 2 or 3.", Ambiguous),
    // MATH style
    (
        "\\frac{14}{3}",
        "$f(-2)+f(-1)+f(0)=\\frac{-8}{-4}+\\frac{-5}{-3}+\\frac{-2}{-2}=2+\\frac{5}{3}+1=\\boxed{\\frac{14}{3}}$",
        Accept,
    ),
    (
        "\\frac{14}{3}",
        "So the sum is $\\boxed{\\dfrac{14}{3}}$.",
        Accept,
    ),
    ("\\frac{14}{3}", "So the sum is $\\boxed{4.67}$.", Reject),
    (
        "3\\sqrt{13}",
        "The distance is $\\sqrt{117} = \\boxed{3\\sqrt{13}}$.",
        Accept,
    ),
    (
        "3\\sqrt{13}",
        "The distance is $\\boxed{\\sqrt{117}}$.",
        Accept,
    ),
    ("\\sqrt{2}", "The side is $\\boxed{1.41421356}$.", Reject),
    (
        "\\sqrt{2}",
        "The side is $\\boxed{\\frac{665857}{470832}}$.",
        Reject,
    ),
    (
        "\\sqrt{2}",
        "The side is $\\boxed{\\frac{2}{\\sqrt{2}}}$.",
        Accept,
    ),
    ("\\pi", "The ratio is $\\boxed{3.14159265}$.", Reject),
    (
        "90^\\circ",
        "Hence the angle is $\\boxed{90^\\circ}$.",
        Accept,
    ),
    ("90", "Hence the angle is $\\boxed{90^{\\circ}}$.", Accept),
    (
        "(3, \\frac{\\pi}{2})",
        "In polar coordinates the point is $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.$",
        Accept,
    ),
    (
        "(3, \\frac{\\pi}{2})",
        "In polar coordinates the point is $\\boxed{\\left( \\frac{\\pi}{2}, 3 \\right)}.$",
        Reject,
    ),
    ("[-2, 7]", "The domain is $\\boxed{[-2, 7]}$.", Accept),
    ("[-2, 7]", "The domain is $\\boxed{(-2, 7)}$.", Reject),
    ("[0, \\infty)", "The range is $\\boxed{x \\ge 0}$.", Accept),
    ("x < 1", "So $-x > -1$, that is the solution set.", Accept),
    ("x < 1", "So $x > -1$.", Reject),
    (
        "(-\\infty, -2) \\cup (2, \\infty)",
        "The solution is $x \\in \\boxed{(-\\infty,-2)\\cup(2,\\infty)}$.",
        Accept,
    ),
    (
        "\\tan^2 y + 1",
        "Using the identity, this equals $\\boxed{\\sec^2 y}$.",
        Accept,
    ),
    (
        "\\sin^2 x",
        "It simplifies to $\\boxed{1 - \\cos^2 x}$.",
        Accept,
    ),
    ("\\sin^2 x", "It simplifies to $\\boxed{\\sin 2x}$.", Reject),
    ("204_5", "The quotient is $\\boxed{204_5}$.", Accept),
    (
        "204_5",
        "The quotient is $\\boxed{54}$ in base 10, that is $204_5$.",
        Accept,
    ),
    ("204_5", "The quotient is $\\boxed{214_5}$.", Reject),
    (
        "\\frac{1}{3}",
        "So $x = 0.\\overline{3}$ and the answer is $\\boxed{0.\\overline{3}}$.",
        Accept,
    ),
    (
        "0.\\overline{3}",
        "The answer is $\\boxed{\\frac13}$.",
        Accept,
    ),
    ("0.\\overline{3}", "The answer is $\\boxed{0.333}$.", Reject),
    (
        "\\emptyset",
        "No real solutions, so the set is $\\boxed{\\emptyset}$.",
        Accept,
    ),
    ("\\emptyset", "The set is $\\boxed{\\{0\\}}$.", Reject),
    (
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        "The product is $\\boxed{\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}}$.",
        Accept,
    ),
    (
        "\\begin{pmatrix} 6 & 8 \\\\ 10 & 12 \\end{pmatrix}",
        "The sum is $\\boxed{\\begin{pmatrix}1 & 2 \\\\ 3 & 4\\end{pmatrix} + \\begin{pmatrix}5 & 6 \\\\ 7 & 8\\end{pmatrix}}$.",
        Accept,
    ),
    (
        "\\begin{pmatrix} 2 & 4 \\\\ 6 & 8 \\end{pmatrix}",
        "$\\boxed{2\\begin{pmatrix}1 & 2 \\\\ 3 & 4\\end{pmatrix}}$",
        Accept,
    ),
    (
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        "The matrix is $\\boxed{\\begin{pmatrix} 1 & 2 & 3 & 4 \\end{pmatrix}}$.",
        Reject,
    ),
    (
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        "The matrix is $\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\\\ 3 \\\\ 4 \\end{pmatrix}}$.",
        Reject,
    ),
    (
        "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}",
        "The vector is $\\boxed{(1, 2)}$.",
        Accept,
    ),
    ("1:15", "The train leaves at $\\boxed{1:15}$.", Accept),
    ("1:15", "The ratio is $\\boxed{\\frac{1}{15}}$.", Reject),
    ("\\frac{1}{15}", "The ratio is $\\boxed{1:15}$.", Reject),
    (
        "3:2",
        "The ratio of boys to girls is $\\boxed{3:2}$.",
        Accept,
    ),
    (
        "(p,q)=(3,2)",
        "Solving, $(p, q) = \\boxed{(3, 2)}$.",
        Accept,
    ),
    ("(3,2)", "So $\\boxed{(p,q)=(3,2)}$.", Accept),
    (
        "f(x)=1",
        "Thus the constant function is $\\boxed{1}$.",
        Accept,
    ),
    ("x = 5", "The solution is $\\boxed{x=5}$.", Accept),
    (
        "5",
        "We get $x = 5 + 5 + 1 = 11$, then $\\boxed{x = 11 - 6 = 5}$.",
        Accept,
    ),
    (
        "\\text{odd}",
        "Therefore the function is $\\boxed{\\text{odd}}$.",
        Accept,
    ),
    (
        "\\text{odd}",
        "Therefore the function is $\\boxed{\\text{even}}$.",
        Reject,
    ),
    ("\\text{(C)}", "The correct option is $\\boxed{C}$.", Accept),
    (
        "\\text{(C)}",
        "The correct option is $\\boxed{\\text{(D)}}$.",
        Reject,
    ),
    (
        "-2, 1",
        "The integers are \\boxed{-2} and \\boxed{1}.",
        Accept,
    ),
    (
        "1, -2",
        "The roots are $\\boxed{-2} \\text{ and } \\boxed{1}$.",
        Accept,
    ),
    (
        "\\{1, 2, 3\\}",
        "The solutions are $\\boxed{1}, \\boxed{2}, \\boxed{3}$.",
        Accept,
    ),
    (
        "5 \\text{ m}",
        "The rope is $\\boxed{5 \\text{ cm}}$ long.",
        Reject,
    ),
    (
        "5 \\text{ cm}",
        "The rope is $\\boxed{5\\,\\text{cm}}$ long.",
        Accept,
    ),
    (
        "5 \\text{ cm}",
        "The rope is $\\boxed{5}$ centimeters long.",
        Accept,
    ),
    (
        "25 \\text{ m}^2",
        "The area is $\\boxed{25 \\text{ m}}$.",
        Reject,
    ),
    ("12", "The answer is $\\boxed{12\\text{ apples}}$.", Accept),
    ("50\\%", "The discount is $\\boxed{50\\%}$.", Accept),
    ("0.5", "The probability is $\\boxed{50\\%}$.", Accept),
    (
        "1.5 \\times 10^{3}",
        "The mass is $\\boxed{1500}$ grams.",
        Accept,
    ),
    // AIME style: intermediate values equal to the gold, boxes revised later
    (
        "255",
        "First, the interest is $\\boxed{255}$. Then the total is 10200 + 255 = 10455.\nFinal Answer: The final answer is $10,455$. I hope it is correct.",
        Reject,
    ),
    (
        "10455",
        "First, the interest is $\\boxed{255}$. Then the total is 10200 + 255 = 10455.\nFinal Answer: The final answer is $10,455$. I hope it is correct.",
        Accept,
    ),
    (
        "336",
        "So $m + n = 336$. Hmm, let me double check: the answer is $\\boxed{337}$.",
        Reject,
    ),
    (
        "337",
        "So $m + n = 336$. Hmm, let me double check: the answer is $\\boxed{337}$.",
        Accept,
    ),
    (
        "42",
        "The answer is 42. Wait, I made an arithmetic error. Recomputing gives \\boxed{43}.",
        Reject,
    ),
    (
        "43",
        "The answer is 42. Wait, I made an arithmetic error. Recomputing gives \\boxed{43}.",
        Accept,
    ),
    (
        "7",
        "<think>Maybe the answer is \\boxed{7}. No, recheck: it is 8.</think>\nThe answer is $\\boxed{8}$.",
        Reject,
    ),
    (
        "8",
        "<think>Maybe the answer is \\boxed{7}. No, recheck: it is 8.</think>\nThe answer is $\\boxed{8}$.",
        Accept,
    ),
    ("8", "<think>The answer is \\boxed{8}", Ambiguous),
    ("8", "\\boxed{7}\n<answer>8</answer>", Accept),
    ("7", "\\boxed{7}\n<answer>8</answer>", Reject),
    (
        "4",
        "The answer is \\boxed{004}.\n\n**Final Answer**\n\\boxed{004}",
        Accept,
    ),
    (
        "19",
        "Final Answer: The maximum number of points that could be in the domain of $f(x)$ is 19.",
        Accept,
    ),
    ("34", "Final Answer: The largest $n$ is 34.", Accept),
    ("1500", "The mass is $\\boxed{1.5e3}$ grams.", Accept),
    ("8", "He pays $5 + $3 = $8.", Accept),
    ("15", "It costs $5. He buys 3, so he pays $15.", Accept),
    ("5", "It costs $5. He buys 3, so he pays $15.", Reject),
    ("B", "The answer is (B).", Accept),
    ("B", "ANSWER: B", Accept),
    ("B", "Therefore the answer is $\\boxed{\\text{A}}$.", Reject),
    ("3, -3", "Final answer: x = 3 or x = -3", Accept),
    ("3", "Final answer: x = 3 or x = -3", Reject),
    ("-3", "The temperature ends at -3 degrees.", Accept),
    ("3", "The temperature dropped to 5-3", Ambiguous),
    ("12", "So we get roughly ~12", Ambiguous),
    ("025", "The answer is $\\boxed{25}$.", Accept),
    (
        "\\frac{5}{2}",
        "The answer is $\\boxed{2\\frac{1}{2}}$.",
        Accept,
    ),
    ("0.25", "The probability is $\\boxed{25}$.", Reject),
    ("\\frac{1}{3}", "$\\frac{1}{3}$ meters", Accept),
    ("12", "The answer is \\boxed{12} or more.", Ambiguous),
    ("12", "So the answer is at least $\\boxed{12}$.", Ambiguous),
    ("12", "The count is not \\boxed{12}", Ambiguous),
    ("5", "The least possible value is $\\boxed{5}$.", Accept),
    ("12", "\\boxed{12 \\text{ or more}}", Reject),
    (
        "18",
        "Therefore, Janet makes $\\$18$ every day at the farmers' market.",
        Accept,
    ),
    ("18", "The final answer is: $\\boxed{18}$", Accept),
    ("18", "Final Answer\n18", Accept),
    ("3", "x = 3", Accept),
    (
        "5",
        "<think>so \\boxed{4}?</think>\n\nThe answer is \\boxed{5}",
        Accept,
    ),
    (
        "\\text{Monday}",
        "The party is on \\boxed{\\text{Monday}}.",
        Accept,
    ),
    ("\\text{Monday}", "\\boxed{Monday or Tuesday}", Reject),
    ("\\text{no}", "\\boxed{No}", Accept),
    ("\\text{yes}", "\\boxed{No}", Reject),
    ("73", "\\boxed{073}", Accept),
    ("24", "The answer is 4! = 24.", Accept),
    ("10", "\\boxed{10\\%}", Accept),
    ("1", "\\boxed{10\\%}", Reject),
    ("(1, 2)", "\\boxed{(2, 1)}", Reject),
    ("x^2", "\\boxed{x \\cdot x}", Accept),
    ("\\frac{x+1}{x-1}", "\\boxed{\\frac{x-1}{x+1}}", Reject),
    ("\\ln 2", "\\boxed{0.693}", Reject),
    ("e^2", "\\boxed{e^2}", Accept),
    ("e^2", "\\boxed{7.389}", Reject),
    ("-\\infty", "\\boxed{\\infty}", Reject),
    ("4", "The answer is 3. \\boxed{4}", Accept),
    ("-3", "The solutions are x = 3 and x = -3.", Ambiguous),
    ("5", "She has 3 cats and 2 dogs, so 5 pets.", Accept),
    ("12", "The sum of 5 and 7 is 12.", Accept),
    (
        "18",
        "Answer: let us compute step by step.\nShe sells 9 eggs at $2, so she makes 18 dollars.",
        Accept,
    ),
    // Reward hacking
    ("2", "\\boxed{2, 3, 4, 5}", Reject),
    ("2", "\\boxed{2} or \\boxed{3}", Reject),
    ("3", "\\boxed{2} or \\boxed{3}", Reject),
    ("2", "\\boxed{\\boxed{2} \\boxed{3}}", Reject),
    ("2", "The answer is one of 1, 2, 3, 4 or 5.", Reject),
    ("2", "$\\frac{1+\\sqrt{5}}{2}$", Reject),
    ("2", "$\\sqrt{2}$", Reject),
    ("2", "$2\\sqrt{2}$", Reject),
    ("2", "$\\frac{\\pi}{2}$", Reject),
    ("2", "$x=\\frac{1}{2}$", Reject),
    ("2", "AZYUK2A", Ambiguous),
    ("2", "The value is x^2.", Ambiguous),
    ("2", "We call it a_2.", Ambiguous),
    ("2", "The answer is \\boxed{２}.", Reject),
    ("2", "The answer is \\boxed{ᒿ}.", Reject),
    ("1", "The answer is \\boxed{l}.", Reject),
    ("0", "The answer is \\boxed{O}.", Reject),
    ("12", "\\boxed{1\\2}", Reject),
    ("12", "The answer is \\boxed{}", Ambiguous),
    ("12", "\\boxed{12", Reject),
    ("5", "\\boxed{5 \\text{ or } 6}", Reject),
    ("5", "\\boxed{\\text{not } 5}", Reject),
    ("5", "\\boxed{\\text{at least } 5}", Reject),
    ("5", "\\boxed{x \\ge 5}", Reject),
    ("5", "\\boxed{\\pm 5}", Reject),
    // A list, even of one value repeated, is not the scalar.
    ("5", "\\boxed{5, 5}", Reject),
    ("5", "\\boxed{5} \\boxed{5}", Reject),
    ("6", "\\boxed{2 3}", Reject),
    ("3", "So x = 2 / 3", Ambiguous),
    ("5 \\text{ m}", "The length is $\\boxed{5}$ cm.", Reject),
    ("5 \\text{ cm}", "The length is $\\boxed{5}$ cm.", Accept),
    ("5 \\text{ m}", "The length is 5 cm.", Reject),
    ("5 m", "The length is 5 cm.", Reject),
    ("\\pi", "\\boxed{\\frac{22}{7}}", Reject),
    ("2", "The answer is \\boxed{2} (or possibly 3).", Ambiguous),
    ("18", "The answer is: **18**", Accept),
    ("18", "<answer>\\boxed{18}</answer>", Accept),
    ("C", "The answer is C or D.", Reject),
    (
        "\\frac{1}{2}",
        "The answer is $\\frac{1}{2}$, i.e. 0.5",
        Accept,
    ),
    ("x^2+1", "\\boxed{x^2+1+0\\cdot y}", Accept),
    ("x^2+1", "\\boxed{x^2 + 1.0000001}", Reject),
    ("1", "\\boxed{\\frac{0}{0}}", Reject),
    ("1", "\\boxed{1^{\\infty}}", Reject),
    ("10", "\\boxed{10^{10^{10^{10}}}}", Reject),
    // Revisions after the marked answer (issue 52)
    (
        "42",
        "She collects 6 eggs a day for 7 days: 6 * 7 = 42.\n#### 42\nWait, I forgot the 2 eggs from Sunday; the correct total is 44",
        Reject,
    ),
    (
        "44",
        "She collects 6 eggs a day for 7 days: 6 * 7 = 42.\n#### 42\nWait, I forgot the 2 eggs from Sunday; the correct total is 44",
        Accept,
    ),
    (
        "12",
        "Each side has 4 points, so a common first guess is $4 \\times 3 = \\boxed{12}$. But each corner is shared by two sides, so we subtract 3: there are 9.",
        Reject,
    ),
    (
        "9",
        "Each side has 4 points, so a common first guess is $4 \\times 3 = \\boxed{12}$. But each corner is shared by two sides, so we subtract 3: there are 9.",
        Accept,
    ),
    (
        "9",
        "The answer is \\boxed{12}. Hmm, that double counts the corners. In total, there are 9 distinct points.",
        Accept,
    ),
    (
        "12",
        "The answer is \\boxed{12}. Hmm, that double counts the corners. In total, there are 9 distinct points.",
        Reject,
    ),
    ("44", "The answer is 42, wait, no, 44.", Accept),
    ("42", "The answer is 42, wait, no, 44.", Reject),
    (
        "44",
        "#### 42\nHmm, no. She also has 2 more, so the total is 44.",
        Accept,
    ),
    (
        "42",
        "#### 42\nHmm, no. She also has 2 more, so the total is 44.",
        Reject,
    ),
    (
        "20",
        "#### 18\nOn second thought, she sells 10 eggs at $2, so she makes 20 dollars.",
        Accept,
    ),
    (
        "18",
        "#### 18\nOn second thought, she sells 10 eggs at $2, so she makes 20 dollars.",
        Reject,
    ),
    (
        "14",
        "#### 18\nWait, I made a mistake: she sells only 7 eggs. \\boxed{14}",
        Accept,
    ),
    (
        "42",
        "#### 42\nActually, I forgot the eggs she gave away.",
        Ambiguous,
    ),
    (
        "6",
        "The answer is \\boxed{6}. Wait, that's wrong.",
        Ambiguous,
    ),
    // ... and what must not revise it
    ("42", "\\boxed{42}\nCheck: 6*7 = 42 ✓", Accept),
    (
        "6",
        "Each row has 6 seats, so the answer is \\boxed{6}.\nCheck: 6 \\times 7 = 42 ✓",
        Accept,
    ),
    (
        "42",
        "Each row has 6 seats, so the answer is \\boxed{6}.\nCheck: 6 \\times 7 = 42 ✓",
        Reject,
    ),
    (
        "6",
        "The answer is \\boxed{6}.\nWait, let me verify: 6 \\times 7 = 42.",
        Accept,
    ),
    (
        "6",
        "The answer is \\boxed{6}. Wait, is that right? Yes.",
        Accept,
    ),
    (
        "5",
        "\\boxed{5}. This is because 2 + 3 = 5 and 3 + 4 = 7.",
        Accept,
    ),
    (
        "7",
        "\\boxed{5}. This is because 2 + 3 = 5 and 3 + 4 = 7.",
        Reject,
    ),
    ("5", "\\boxed{5}\nNote that the discriminant is 16.", Accept),
    (
        "12",
        "\\boxed{12}. There are 3 cases to consider in the proof.",
        Accept,
    ),
    (
        "12",
        "\\boxed{12}\nSo the total is 12, and each of the 3 friends gets 4.",
        Accept,
    ),
    ("18", "#### 18\nI hope it is correct.", Accept),
    (
        "18",
        "9 * 2 = 18.\n#### 18\nWait, let me double-check: 9 * 2 = 18. Yes.",
        Accept,
    ),
    (
        "42",
        "\\boxed{42}\n\nActually, wait: 6 × 7 = 42, so yes, 42 is correct.",
        Accept,
    ),
    ("18", "\\boxed{18}\nThere are 9 eggs sold.", Accept),
    (
        "18",
        "\\boxed{18}\nThus the number of eggs sold is 9.",
        Accept,
    ),
    ("5", "\\boxed{5}. But note that there are 3 cases.", Accept),
    (
        "44",
        "So the total is \\boxed{42}. Actually, I made a mistake: she also bought 2 more, giving 44.",
        Accept,
    ),
    (
        "42",
        "So the total is \\boxed{42}. Actually, I made a mistake: she also bought 2 more, giving 44.",
        Reject,
    ),
    (
        "9",
        "I initially got \\boxed{12}, but after removing duplicates there are 9.",
        Accept,
    ),
    (
        "12",
        "I initially got \\boxed{12}, but after removing duplicates there are 9.",
        Reject,
    ),
    ("9", "The answer is 12? No — there are 9.", Accept),
    ("12", "The answer is 12? No — there are 9.", Reject),
    ("44", "**Final answer: 42**\n\nCorrection: 44", Accept),
    ("42", "**Final answer: 42**\n\nCorrection: 44", Reject),
    ("44", "The answer is 42 (wait, I mean 44).", Accept),
    (
        "9",
        "The final answer is 12.\nHold on — the corners are shared, so the count is 9.",
        Accept,
    ),
    ("\\text{no}", "\\boxed{No}", Accept),
    (
        "\\emptyset",
        "So the set is $\\boxed{\\emptyset}$. There are no solutions.",
        Accept,
    ),
    // Closed forms and words in whole completions
    ("3", "So $\\log_2 8 = \\boxed{\\log_2 8}$.", Accept),
    (
        "10",
        "The number of pairs is $\\boxed{\\binom{5}{2}}$.",
        Accept,
    ),
    ("42", "The answer is forty-two.", Accept),
    ("42", "**Answer:** \\textbf{42}", Accept),
    ("105", "one hundred and five", Accept),
];

fn verifier() -> MathVerifier {
    MathVerifier::new(&MathConfig::default()).expect("default config is valid")
}

fn outcome(verifier: &MathVerifier, gold: &str, completion: &str) -> Outcome {
    let reference = Reference {
        answer: Some(gold.into()),
        ..Reference::default()
    };
    verifier
        .score(&RewardInput::new("", completion, &reference))
        .outcome
}

#[test]
fn every_completion_is_judged_as_expected() {
    let verifier = verifier();
    let failures: Vec<String> = COMPLETIONS
        .iter()
        .filter_map(|(gold, completion, expect)| {
            let got = outcome(&verifier, gold, completion);
            let ok = match expect {
                Accept => got == Outcome::Correct,
                Reject => got != Outcome::Correct,
                Ambiguous => got == Outcome::UnparseablePrediction,
            };
            (!ok).then(|| {
                format!("gold {gold:?} completion {completion:?}: expected {expect:?}, got {got:?}")
            })
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn the_table_covers_acceptance_rejection_and_ambiguity() {
    let count = |kind: Expect| COMPLETIONS.iter().filter(|row| row.2 == kind).count();
    assert!(count(Accept) >= 50 && count(Reject) >= 40 && count(Ambiguous) >= 8);
}

#[test]
fn huge_outputs_are_bounded_and_never_score() {
    let verifier = verifier();
    // Every candidate listed: a list, never the scalar gold.
    let every: Vec<String> = (0..5000).map(|n| n.to_string()).collect();
    let listed = format!("\\boxed{{{}}}", every.join(", "));
    assert_ne!(outcome(&verifier, "2", &listed), Outcome::Correct);
    // A megabyte of reasoning before the answer still finds the answer, quickly.
    let long = format!(
        "{}The answer is $\\boxed{{2}}$.",
        "We compute 1 + 1. ".repeat(60_000)
    );
    let started = std::time::Instant::now();
    assert_eq!(outcome(&verifier, "2", &long), Outcome::Correct);
    assert!(
        started.elapsed().as_secs_f64() < 2.0,
        "{:?}",
        started.elapsed()
    );
    // A megabyte of braces, dollars and backslashes: no panic, no hang, no score.
    for junk in ["{", "$", "\\", "\\boxed{", "\\frac{", "^{", "(", "\\left("] {
        let text = junk.repeat(200_000);
        let started = std::time::Instant::now();
        assert_ne!(outcome(&verifier, "2", &text), Outcome::Correct);
        assert!(
            started.elapsed().as_secs_f64() < 2.0,
            "{junk:?}: {:?}",
            started.elapsed()
        );
    }
}

/// Issue 52: the answer a model took back was still accepted (a second suite agreed on 94.3%
/// with two false accepts of this form); the taken-back value now scores 0, the correction 1.
#[test]
fn an_answer_taken_back_scores_zero_and_its_correction_scores_one() {
    let verifier = verifier();
    let score = |gold: &str, completion: &str| {
        let reference = Reference {
            answer: Some(gold.into()),
            ..Reference::default()
        };
        verifier
            .score(&RewardInput::new("", completion, &reference))
            .score
    };
    let eggs = "#### 42\nWait, I forgot the 2 eggs; the correct total is 44";
    assert_eq!(score("42", eggs), 0.0);
    assert_eq!(score("44", eggs), 1.0);
    let guess = "A common first guess is \\boxed{12}... but the corners are shared, so there are 9";
    assert_eq!(score("12", guess), 0.0);
    assert_eq!(score("9", guess), 1.0);
}

#[test]
fn a_reference_solution_is_read_as_written_without_revisions() {
    let verifier = verifier();
    // The reference's own words after its box are trusted, not read as a retraction.
    let reference = Reference {
        answer: Some(
            "So there are $\\boxed{12}$ ways. Actually, we could also count the 3 corners first."
                .into(),
        ),
        ..Reference::default()
    };
    let outcome = verifier.score(&RewardInput::new("", "\\boxed{12}", &reference));
    assert_eq!(outcome.outcome, Outcome::Correct);
}

#[test]
fn closed_forms_and_revisions_are_bounded() {
    let verifier = verifier();
    let bounded = |gold: &str, completion: &str| {
        let started = std::time::Instant::now();
        let got = outcome(&verifier, gold, completion);
        assert!(
            started.elapsed().as_secs_f64() < 2.0,
            "{completion:.80}: {:?}",
            started.elapsed()
        );
        got
    };
    for huge in [
        "\\boxed{1000000!}",
        "\\boxed{\\binom{10^{9}}{10^{8}}}",
        "\\boxed{(10^{400})!}",
        "\\boxed{((((5!)!)!)!)}",
        "\\boxed{\\frac{(10^{9})!}{(10^{9}-500)!}}",
        "\\boxed{\\log_2 2^{100000}}",
        "\\boxed{\\log_{10^{-400}} 10^{400}}",
        "\\boxed{\\sin(10^{4000}\\pi + \\frac{\\pi}{7})}",
    ] {
        assert_ne!(bounded("1", huge), Outcome::Correct, "{huge}");
    }
    assert_eq!(
        bounded("-1", "\\boxed{\\log_{10^{-400}} 10^{400}}"),
        Outcome::Correct
    );
    let cues = format!(
        "\\boxed{{5}}{}",
        " Wait, no. Actually, hold on.".repeat(20_000)
    );
    assert_ne!(bounded("5", &cues), Outcome::Correct);
    let statements = format!(
        "\\boxed{{5}}{}",
        " So there are 9 ways. The correct total is 4.".repeat(20_000)
    );
    assert_eq!(bounded("4", &statements), Outcome::Correct);
    let checks = format!("\\boxed{{5}}{}", "\nCheck: 5 = 5 ✓".repeat(20_000));
    assert_eq!(bounded("5", &checks), Outcome::Correct);
    let words = format!("\\boxed{{{}}}", "forty-two ".repeat(300));
    assert_ne!(bounded("42", &words), Outcome::Correct);
    // Factorial quotients nested in factorial quotients (9 levels, the most the parser's depth
    // limit takes): each factor is evaluated once.
    let mut nested = String::from("n");
    for _ in 0..9 {
        nested = format!("\\frac{{({nested})! 1! 2! 3! 4! 5! 6! 7!}}{{1! 2! 3! 4! 5! 6! 7! n!}}");
    }
    let started = std::time::Instant::now();
    let _ = verifier.judge("", "n", &nested);
    assert!(
        started.elapsed().as_secs_f64() < 2.0,
        "{:?}",
        started.elapsed()
    );
    // Font wrappers inside one another are read to a fixed depth, not recursed without bound.
    let wrapped = format!("{}10{}", "\\bm{".repeat(50_000), "}".repeat(50_000));
    let started = std::time::Instant::now();
    assert_ne!(verifier.judge("", "10", &wrapped).outcome, Outcome::Correct);
    assert!(started.elapsed().as_secs_f64() < 2.0);
    assert_eq!(
        verifier.judge("", "10", "\\bm{\\bm{10}}").outcome,
        Outcome::Correct
    );
    let pairs = format!("\\boxed{{{}5, 2{}}}", "C(".repeat(400), ")".repeat(400));
    assert_ne!(bounded("10", &pairs), Outcome::Correct);
}

#[test]
fn closed_forms_and_revision_fragments_never_panic() {
    let verifier = verifier();
    let fragments = [
        "\\boxed{",
        "}",
        "$",
        "\\binom{",
        "\\choose",
        "C(",
        ",",
        ")",
        "!",
        "\\log_",
        "\\ln",
        "\\sin",
        "\\pi",
        "^\\circ",
        "°",
        "\\mathbb{R}",
        "\\mathbb",
        "ℝ",
        "forty",
        "-",
        "two",
        " and a half",
        "minus ",
        "\\textbf{",
        "10^{9}",
        "0",
        "Wait, ",
        "No, ",
        "the correct total is ",
        "there are ",
        "so the sum is ",
        "Check: ",
        "✓",
        "#### ",
        "\n",
        ". ",
    ];
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..3000 {
        let mut text = String::new();
        for _ in 0..14 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            text.push_str(fragments[(state >> 33) as usize % fragments.len()]);
        }
        let got = outcome(&verifier, "2", &text);
        let _ = outcome(&verifier, &text, "\\boxed{2}");
        assert!(
            matches!(
                got,
                Outcome::Correct
                    | Outcome::Wrong
                    | Outcome::UnparseablePrediction
                    | Outcome::FormatError
            ),
            "{text:?}: {got:?}"
        );
    }
}

#[test]
fn adversarial_fragments_never_panic() {
    let verifier = verifier();
    let fragments = [
        "\\boxed",
        "{",
        "}",
        "$",
        "$$",
        "\\(",
        "\\)",
        "\\[",
        "\\]",
        "\\frac",
        "\\sqrt",
        "^",
        "_",
        "1",
        "2,",
        ".",
        "-",
        "\\begin{pmatrix}",
        "&",
        "\\\\",
        "\\end{pmatrix}",
        "\\overline{",
        ":",
        "=",
        "<",
        "\\le",
        "x",
        "\\text{",
        "e",
        "<think>",
        "</think>",
        "<answer>",
        "#### ",
        "The answer is ",
        "ℵ",
        "\u{0}",
        "٣",
        "²",
    ];
    // Deterministic pseudo-random concatenations (a linear congruential generator).
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    for _ in 0..3000 {
        let mut text = String::new();
        for _ in 0..12 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            text.push_str(fragments[(state >> 33) as usize % fragments.len()]);
        }
        let got = outcome(&verifier, "2", &text);
        let _ = outcome(&verifier, &text, "\\boxed{2}");
        assert!(
            matches!(
                got,
                Outcome::Correct
                    | Outcome::Wrong
                    | Outcome::UnparseablePrediction
                    | Outcome::FormatError
            ),
            "{text:?}: {got:?}"
        );
    }
}
